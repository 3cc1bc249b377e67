// Package serve runs the components' plain HTTP endpoints (/metrics, /healthz) with bounds, so
// that slow or idle clients cannot pin goroutines and buffers (issue 26).
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// HTTP serves handler on address until ctx ends.
func HTTP(ctx context.Context, address string, handler http.Handler) error {
	return HTTPS(ctx, address, handler, nil)
}

// HTTPS serves handler on address with tlsConfig (plain HTTP when nil) until ctx ends.
func HTTPS(ctx context.Context, address string, handler http.Handler, tlsConfig *tls.Config) error {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", address, err)
	}
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	stop := context.AfterFunc(ctx, func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	})
	defer stop()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving %s: %w", l.Addr(), err)
	}
	return nil
}

// Health answers /healthz with "ok" while the process runs.
func Health() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	return mux
}
