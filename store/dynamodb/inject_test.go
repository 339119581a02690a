package dynamodb

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// injector is an HTTP client that lets a test rewrite DynamoDB requests
// and responses on their way to and from dynalite, to produce what
// dynalite never does on its own (unprocessed keys and items, stale index
// entries).
type injector struct {
	tr *http.Transport

	mu sync.Mutex
	// rewrite, if set, is called for each request of operation op with its
	// JSON body; it returns the body to send and a function applied to the
	// response body (either may be nil: unchanged).
	rewrite func(op string, req map[string]any) (sendReq map[string]any, resp func(map[string]any))
}

func newInjector(t testing.TB) *injector {
	in := &injector{tr: &http.Transport{}}
	t.Cleanup(in.tr.CloseIdleConnections)
	return in
}

func (in *injector) set(rw func(op string, req map[string]any) (map[string]any, func(map[string]any))) {
	in.mu.Lock()
	in.rewrite = rw
	in.mu.Unlock()
}

func (in *injector) Do(r *http.Request) (*http.Response, error) {
	in.mu.Lock()
	rw := in.rewrite
	in.mu.Unlock()
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	var respFn func(map[string]any)
	if rw != nil && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		var req map[string]any
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		var send map[string]any
		send, respFn = rw(op, req)
		if send != nil {
			if body, err = json.Marshal(send); err != nil {
				return nil, err
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	resp, err := in.tr.RoundTrip(r)
	if err != nil || respFn == nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	respFn(out)
	if body, err = json.Marshal(out); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	return resp, nil
}
