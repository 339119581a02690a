package testenv

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Admiral-Piett/goaws/app"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"

	"github.com/outboxrelay/outbox/internal/servers"
)

// GoAWSRegion and GoAWSAccount are the region and account of the goaws
// server; it accepts any credentials.
const (
	GoAWSRegion  = "us-east-1"
	GoAWSAccount = "100010001000"
)

// GoAWS is goaws (github.com/Admiral-Piett/goaws v0.4.5), an SQS and SNS
// server written in Go, served from inside the test process on 127.0.0.1.
//
// goaws keeps its queues and topics in process-wide variables, so there
// is one server per test process ([GoAWSServer]); tests isolate themselves
// with queue and topic names of their own ([Name]). Pause and Resume stop
// and start its listener on the same port, keeping what it stored, like a
// broker restart. goaws does not lock all its state for each request
// (a data race under -race), so the server here takes its requests one at
// a time, as SQS would order them anyway.
//
// What goaws v0.4.5 does and does not implement, for the SDK's query
// protocol (it has no JSON protocol: clients need sqs.QueryProtocol):
//
//   - SQS: CreateQueue (FIFO by the .fifo suffix), GetQueueUrl,
//     GetQueueAttributes, SendMessage (with message attributes, group and
//     de-duplication IDs), SendMessageBatch (group and de-duplication IDs,
//     but NOT message attributes: goaws drops them; the server here
//     therefore answers SendMessageBatch to an existing queue by running
//     goaws's SendMessage for each entry, in order, and answering per
//     entry as SQS does; see sendMessageBatch), DeleteQueue,
//     PurgeQueue, ReceiveMessage. No IAM (every request is allowed), no
//     throttling, no per-entry failures in SendMessageBatch, no size limit
//     in SendMessageBatch. FIFO de-duplication by MessageDeduplicationId is
//     on (EnableDuplicates), without expiry.
//   - SNS: CreateTopic, DeleteTopic, Subscribe (SQS queues), Publish (no
//     FIFO topics: MessageGroupId and MessageDeduplicationId are ignored);
//     NOT PublishBatch, which the server here answers by running goaws's
//     Publish for each entry (see publishBatch).
type GoAWS struct {
	addr string

	mu     sync.Mutex // one request at a time; also guards srv
	srv    *http.Server
	paused bool
}

// Endpoint returns the server's URL, http://127.0.0.1:PORT.
func (g *GoAWS) Endpoint() string { return "http://" + g.addr }

// QueueURL returns the URL of the queue called name.
func (g *GoAWS) QueueURL(name string) string { return g.Endpoint() + "/" + GoAWSAccount + "/" + name }

// GoAWSMessage is a message stored in a goaws queue.
type GoAWSMessage struct {
	Body                     string
	Attributes               map[string]string // message attributes: name → value
	GroupID, DeduplicationID string
}

// Messages returns up to limit messages (all when limit < 0) stored in queue,
// in the order it stored them (its delivery order), from the index from
// on, and how many it holds from there; ok is false when the queue does
// not exist. It holds the server for as long as it copies: callers that
// poll ask only for what they need.
func (g *GoAWS) Messages(queue string, from, limit int) (msgs []GoAWSMessage, stored int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	app.SyncQueues.RLock()
	defer app.SyncQueues.RUnlock()
	q, ok := app.SyncQueues.Queues[queue]
	if !ok {
		return nil, 0, false
	}
	stored = max(0, len(q.Messages)-from)
	for i := from; i < len(q.Messages) && (limit < 0 || i < from+limit); i++ {
		m := q.Messages[i]
		gm := GoAWSMessage{Body: string(m.MessageBody), GroupID: m.GroupID, DeduplicationID: m.DeduplicationID, Attributes: map[string]string{}}
		for name, a := range m.MessageAttributes {
			gm.Attributes[name] = a.Value
		}
		msgs = append(msgs, gm)
	}
	return msgs, stored, true
}

// Pause closes the listener and every connection: clients see the server
// gone. What it stored stays, for Resume.
func (g *GoAWS) Pause() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		return errors.New("testenv: goaws: paused already")
	}
	g.paused = true
	return g.srv.Close()
}

// Resume listens again on the same port.
func (g *GoAWS) Resume() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.paused {
		return errors.New("testenv: goaws: running already")
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = g.listen(); err == nil {
			g.paused = false
			return nil
		}
		time.Sleep(20 * time.Millisecond) // the port may linger a moment: retry the bind
	}
	return err
}

// listen starts serving on g.addr; g.mu is held.
func (g *GoAWS) listen() error {
	l, err := net.Listen("tcp", g.addr)
	if err != nil {
		return fmt.Errorf("testenv: goaws: listen on %s: %w", g.addr, err)
	}
	h := router.New()
	g.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read the request and buffer the answer outside the lock, so
			// that requests wait for each other only while goaws works.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := httptest.NewRecorder()
			g.mu.Lock()
			form, _ := url.ParseQuery(string(body))
			if !g.sendMessageBatch(h, rec, r, form) && !g.publishBatch(h, rec, r, form) {
				h.ServeHTTP(rec, r)
			}
			g.mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go g.srv.Serve(l)
	return nil
}

func (g *GoAWS) stop() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		return nil
	}
	g.paused = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		return g.srv.Close()
	}
	return nil
}

var sharedGoAWS lazy[*GoAWS]

// GoAWSServer returns the test process's goaws server, started on first
// use and stopped by Main. Clients use [GoAWSRegion], any credentials, and
// the query protocol.
func GoAWSServer(t testing.TB) *GoAWS {
	t.Helper()
	requireMain(t)
	g, err := sharedGoAWS.get(startGoAWS)
	if err != nil {
		t.Fatalf("testenv: goaws: %v", err)
	}
	return g
}

// StartGoAWS starts the process's goaws server (the one [GoAWSServer]
// returns), for use outside of tests, such as a bench run by hand against
// sqs:// and sns:// URLs. It listens on 127.0.0.1 on a free port; it is
// stopped with the process, or by servers.StopAll.
func StartGoAWS() (*GoAWS, error) { return sharedGoAWS.get(startGoAWS) }

func startGoAWS() (*GoAWS, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	logrus.SetOutput(io.Discard) // goaws logs every message at info level
	app.CurrentEnvironment.Host = "127.0.0.1"
	app.CurrentEnvironment.Port = strconv.Itoa(port)
	app.CurrentEnvironment.Region = GoAWSRegion
	app.CurrentEnvironment.AccountID = GoAWSAccount
	app.CurrentEnvironment.EnableDuplicates = true
	g := &GoAWS{addr: "127.0.0.1:" + strconv.Itoa(port)}
	g.mu.Lock()
	err = g.listen()
	g.mu.Unlock()
	if err != nil {
		return nil, err
	}
	servers.AtExit("goaws", g.stop)
	return g, nil
}

// batchEntryPrefix starts the form keys of SendMessageBatch's entries.
const batchEntryPrefix = "SendMessageBatchRequestEntry."

// sendMessageBatch answers a SendMessageBatch request to an existing
// queue by running goaws's SendMessage for each entry, in order, and
// reports whether it did (otherwise goaws's own handler answers: a
// missing queue, a malformed batch). goaws v0.4.5's SendMessageBatch
// drops the entries' message attributes; its SendMessage keeps them. The
// answer has SQS's per-entry form: each entry succeeded or failed (with
// goaws's error code, as a sender fault). g.mu is held.
func (g *GoAWS) sendMessageBatch(h http.Handler, w http.ResponseWriter, r *http.Request, form url.Values) bool {
	if form.Get("Action") != "SendMessageBatch" {
		return false
	}
	queueURL := form.Get("QueueUrl")
	queue := queueURL[strings.LastIndex(queueURL, "/")+1:]
	app.SyncQueues.RLock()
	_, exists := app.SyncQueues.Queues[queue]
	app.SyncQueues.RUnlock()
	entries := batchEntries(form, batchEntryPrefix)
	if !exists || entries == nil {
		return false
	}
	var result app.SendMessageBatchResult
	for _, e := range entries {
		id := e.Get("Id")
		e.Del("Id")
		e.Set("Action", "SendMessage")
		e.Set("QueueUrl", queueURL)
		e.Set("Version", form.Get("Version"))
		rec := serveForm(h, r, e)
		if rec.Code == http.StatusOK {
			var ok app.SendMessageResponse
			if err := xml.Unmarshal(rec.Body.Bytes(), &ok); err == nil {
				result.Entry = append(result.Entry, app.SendMessageBatchResultEntry{
					Id: id, MessageId: ok.Result.MessageId, MD5OfMessageBody: ok.Result.MD5OfMessageBody,
					MD5OfMessageAttributes: ok.Result.MD5OfMessageAttributes, SequenceNumber: ok.Result.SequenceNumber,
				})
				continue
			}
		}
		var failed app.ErrorResponse
		_ = xml.Unmarshal(rec.Body.Bytes(), &failed)
		result.Error = append(result.Error, app.BatchResultErrorEntry{Id: id, Code: failed.Result.Code, Message: failed.Result.Message, SenderFault: true})
	}
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(app.SendMessageBatchResponse{
		Xmlns:    "http://queue.amazonaws.com/doc/2012-11-05/",
		Result:   result,
		Metadata: app.ResponseMetadata{RequestId: "00000000-0000-0000-0000-000000000000"},
	})
	return true
}

// batchEntries splits the entries of a batch request's form, whose keys
// start with prefix and the entry's number ("SendMessageBatchRequestEntry.1.Id"),
// into one form per entry, in order; nil for no entries, more than 10,
// gaps or repeated Ids.
func batchEntries(form url.Values, prefix string) []url.Values {
	byNum := map[int]url.Values{}
	for k, v := range form {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		num, field, ok := strings.Cut(rest, ".")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || n < 1 {
			return nil
		}
		if byNum[n] == nil {
			byNum[n] = url.Values{}
		}
		byNum[n][field] = v
	}
	if len(byNum) == 0 || len(byNum) > 10 {
		return nil
	}
	entries := make([]url.Values, 0, len(byNum))
	ids := map[string]bool{}
	for n := 1; n <= len(byNum); n++ {
		e := byNum[n]
		if e == nil || ids[e.Get("Id")] {
			return nil
		}
		ids[e.Get("Id")] = true
		entries = append(entries, e)
	}
	return entries
}

// serveForm runs h on a POST of form and returns the answer.
func serveForm(h http.Handler, r *http.Request, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, r.URL.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// publishBatch answers an SNS PublishBatch request, which goaws v0.4.5
// does not implement, by running goaws's Publish for each entry, in order,
// with SNS's per-entry answer, and reports whether it did. A missing topic
// gets goaws's own answer to a Publish (NonExistentTopic) for the whole
// request, as SNS answers NotFound. g.mu is held.
func (g *GoAWS) publishBatch(h http.Handler, w http.ResponseWriter, r *http.Request, form url.Values) bool {
	if form.Get("Action") != "PublishBatch" {
		return false
	}
	entries := batchEntries(form, "PublishBatchRequestEntries.member.")
	if entries == nil {
		return false
	}
	arn := form.Get("TopicArn")
	app.SyncTopics.RLock()
	_, exists := app.SyncTopics.Topics[arn[strings.LastIndex(arn, ":")+1:]]
	app.SyncTopics.RUnlock()
	publish := func(e url.Values) *httptest.ResponseRecorder {
		e.Set("Action", "Publish")
		e.Set("TopicArn", arn)
		e.Set("Version", form.Get("Version"))
		return serveForm(h, r, e)
	}
	if !exists {
		rec := publish(entries[0])
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return true
	}
	var ok, failed strings.Builder
	for _, e := range entries {
		id := e.Get("Id")
		e.Del("Id")
		rec := publish(e)
		if rec.Code == http.StatusOK {
			var res app.PublishResponse
			_ = xml.Unmarshal(rec.Body.Bytes(), &res)
			fmt.Fprintf(&ok, "<member><Id>%s</Id><MessageId>%s</MessageId></member>", xmlText(id), xmlText(res.Result.MessageId))
			continue
		}
		var res app.ErrorResponse
		_ = xml.Unmarshal(rec.Body.Bytes(), &res)
		fmt.Fprintf(&failed, "<member><Id>%s</Id><Code>%s</Code><Message>%s</Message><SenderFault>true</SenderFault></member>", xmlText(id), xmlText(res.Result.Code), xmlText(res.Result.Message))
	}
	w.Header().Set("Content-Type", "application/xml")
	fmt.Fprintf(w, `<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>%s</Successful><Failed>%s</Failed></PublishBatchResult><ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ResponseMetadata></PublishBatchResponse>`, ok.String(), failed.String())
	return true
}

// xmlText escapes s for XML character data.
func xmlText(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
