package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// checkHTTPAddr checks --http-addr without binding it.
func (a *app) checkHTTPAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("%s %q is not host:port (%v); use something like %s, or :0 for any free port", a.flagRef("http-addr"), addr, stripAddrErr(err), HTTPAddrDefault)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("%s %q has port %q; use a number from 0 to 65535 (0 picks a free port)", a.flagRef("http-addr"), addr, port)
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		return usagef("%s %q has host %q; use an IP address or a host name, such as 127.0.0.1", a.flagRef("http-addr"), addr, host)
	}
	return nil
}

// stripAddrErr keeps the reason of a net.AddrError without repeating the
// address.
func stripAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

type httpServer struct {
	srv  *http.Server
	done chan error
}

// serveHTTP serves /healthz, /metrics and what obs mounts (/readyz, and
// /debug/pprof/ with --pprof) on addr until shutdown, and every other path
// with console when it is not nil. An empty addr serves nothing.
func (a *app) serveHTTP(addr string, obs *observability, console http.Handler) (*httpServer, error) {
	if addr == "" {
		a.log.Info("http disabled (--http-addr is empty)")
		return &httpServer{}, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	obs.mount(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(obs.reg, promhttp.HandlerOpts{Registry: obs.reg}))
	if console != nil {
		mux.Handle("/", console)
	}
	return a.listenHTTP(addr, mux)
}

// listenHTTP serves h on addr until shutdown and logs "http listening"
// with the address bound.
func (a *app) listenHTTP(addr string, h http.Handler) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", a.flagRef("http-addr"), addr, err)
	}
	s := &httpServer{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       time.Minute,
		},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	a.log.Info("http listening", "addr", ln.Addr().String())
	return s, nil
}

// shutdown stops the server, waiting up to timeout for requests in flight.
func (s *httpServer) shutdown(timeout time.Duration) error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close()) // requests still in flight: cut them
	}
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
