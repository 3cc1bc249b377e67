package domain

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"libvirt.org/go/libvirt"
)

// ensureEventLoop registers libvirt's default event implementation and runs its loop in a
// goroutine, once per process: libvirt delivers events and keepalives only through it.
var ensureEventLoop = sync.OnceValue(func() error {
	if err := libvirt.EventRegisterDefaultImpl(); err != nil {
		return fmt.Errorf("registering libvirt's event loop: %w", err)
	}
	go func() {
		for {
			if err := libvirt.EventRunDefaultImpl(); err != nil {
				slog.Error("running libvirt's event loop", "err", err)
				// An error here tends to repeat at once; do not spin on it.
				time.Sleep(time.Second)
			}
		}
	}()
	return nil
})
