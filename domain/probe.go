package domain

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"libvirt.org/go/libvirt"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// probeTimeout is how long a KVM probe guest has to print. Under working KVM a Linux
// kernel prints within about a second; under nested KVM that cannot boot Linux it hangs
// in its decompressor and prints nothing, however long one waits.
const probeTimeout = 10 * time.Second

// ResolveAcceleration turns Auto into KVM or TCG with ProbeKVM; KVM and TCG stay as asked.
func ResolveAcceleration(ctx context.Context, conn *Conn, a Acceleration, kernel, initrd string) (Acceleration, error) {
	if a != Auto {
		if _, err := domainType(a); err != nil {
			return "", err
		}
		return a, nil
	}
	ok, err := ProbeKVM(ctx, conn, kernel, initrd)
	if err != nil {
		return "", err
	}
	if ok {
		return KVM, nil
	}
	return TCG, nil
}

// ProbeKVM boots a small transient KVM domain from kernel and initrd and reports whether
// it printed anything on its serial console within a few seconds. Only a guest that printed
// proves KVM can run it: QEMU starting, or a BIOS running, is not enough. Why KVM was found
// unusable is logged. An error means the probe itself could not be made.
func ProbeKVM(ctx context.Context, conn *Conn, kernel, initrd string) (bool, error) {
	log := slog.With("probe", "kvm")
	printed, startErr, err := bootPrints(ctx, conn, KVM, kernel, initrd)
	switch {
	case err != nil:
		return false, fmt.Errorf("probing KVM: %w", err)
	case startErr != nil:
		log.Info("KVM is not usable: a KVM domain does not start; guests will run under TCG", "err", startErr)
	case printed:
		log.Info("KVM is usable: a KVM guest printed on its serial console")
	default:
		log.Info("KVM is not usable: a KVM guest printed nothing on its serial console; guests will run under TCG",
			"waited", probeTimeout, "hint", "nested KVM can start QEMU and a BIOS yet hang a Linux kernel in its decompressor")
	}
	return printed, nil
}

// bootPrints boots a small transient domain under accel from kernel and initrd and reports
// whether it printed on its serial console within probeTimeout. startErr is why the domain
// did not start at all; err means the probe itself could not be made.
func bootPrints(ctx context.Context, conn *Conn, accel Acceleration, kernel, initrd string) (printed bool, startErr, err error) {
	dir, err := os.MkdirTemp("", "lifeboat-probe-")
	if err != nil {
		return false, nil, err
	}
	defer os.RemoveAll(dir)
	console := filepath.Join(dir, "console.log")
	id := uuid.New()
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lifeboat", Name: "probe-" + id.String()[:8], UID: types.UID(id.String())},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs:   1,
			Memory: resource.MustParse("128Mi"),
			// Not quiet: the kernel's first messages are the earliest proof that it runs.
			Boot: v1alpha1.BootSource{Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0"},
		},
	}
	domainXML, err := DomainXML(vmi, XMLOptions{Acceleration: accel, ConsoleLog: console})
	if err != nil {
		return false, nil, err
	}
	// Autodestroy: should this process die mid-probe, libvirt removes the domain when the
	// connection closes.
	dom, err := conn.virt.DomainCreateXML(domainXML, libvirt.DOMAIN_START_AUTODESTROY)
	if err != nil {
		return false, err, nil
	}
	defer func() {
		if err := dom.Destroy(); err != nil {
			slog.Warn("destroying a probe domain", "acceleration", accel, "err", err)
		}
		dom.Free()
	}()
	printed, err = consolePrinted(ctx, console, probeTimeout)
	return printed, nil, err
}

// consolePrinted waits, at most timeout, until the console log file has something in it. It
// returns false when the time is up and an error only when ctx ends.
func consolePrinted(ctx context.Context, console string, timeout time.Duration) (bool, error) {
	probeCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		if fi, err := os.Stat(console); err == nil && fi.Size() > 0 {
			return true, nil
		}
		select {
		case <-probeCtx.Done():
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			return false, nil
		case <-ticker.C:
		}
	}
}
