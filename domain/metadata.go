package domain

import (
	"encoding/xml"
	"errors"
	"fmt"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
)

// MetadataNamespace is the XML namespace of lifeboat's element in a domain's metadata.
const MetadataNamespace = "https://lifeboat.dev/domain/1"

// metadataPrefix is the namespace prefix libvirt writes the element with.
const metadataPrefix = "lifeboat"

// Metadata is lifeboat's record in a domain: which VMI the domain is, and state that must
// outlive the agent's and launcher's memory. It travels with the domain on migration.
type Metadata struct {
	Namespace string `xml:"namespace"`
	Name      string `xml:"name"`
	UID       string `xml:"uid"`
	// GracefulShutdown is set once the launcher was asked to stop (SIGTERM), so a restarted
	// agent still knows the guest is being shut down and by when.
	GracefulShutdown *GracefulShutdown `xml:"gracefulShutdown,omitempty"`
}

// GracefulShutdown records a request to stop the VM: when it came and when the guest must be gone.
type GracefulShutdown struct {
	SignalTime time.Time `xml:"signalTime"`
	Deadline   time.Time `xml:"deadline"`
}

// metadataElement is the name of lifeboat's element in the domain's <metadata>.
var metadataElement = xml.Name{Space: MetadataNamespace, Local: "vmi"}

func marshalMetadata(m Metadata) (string, error) {
	var b strings.Builder
	if err := xml.NewEncoder(&b).EncodeElement(m, xml.StartElement{Name: metadataElement}); err != nil {
		return "", fmt.Errorf("writing lifeboat's domain metadata: %w", err)
	}
	return b.String(), nil
}

// parseMetadata reads lifeboat's element. libvirt returns it without its namespace, so
// only its local name is checked.
func parseMetadata(s string) (Metadata, error) {
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		tok, err := d.Token()
		if err != nil {
			return Metadata{}, fmt.Errorf("reading lifeboat's domain metadata %q: %w", s, err)
		}
		start, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if start.Name.Local != metadataElement.Local {
			return Metadata{}, fmt.Errorf("reading lifeboat's domain metadata: element <%s>, want <%s>", start.Name.Local, metadataElement.Local)
		}
		var m Metadata
		if err := d.DecodeElement(&m, &start); err != nil {
			return Metadata{}, fmt.Errorf("reading lifeboat's domain metadata: %w", err)
		}
		return m, nil
	}
}

// Metadata reads lifeboat's record from the named domain (its live definition while it runs).
func (c *Conn) Metadata(name string) (Metadata, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return Metadata{}, err
	}
	defer dom.Free()
	s, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNamespace, libvirt.DOMAIN_AFFECT_CURRENT)
	if err != nil {
		var verr libvirt.Error
		if errors.As(err, &verr) && verr.Code == libvirt.ERR_NO_DOMAIN_METADATA {
			return Metadata{}, fmt.Errorf("domain %q has no lifeboat metadata, so lifeboat did not make it: %w", name, err)
		}
		return Metadata{}, fmt.Errorf("reading the metadata of domain %q: %w", name, err)
	}
	return parseMetadata(s)
}

// SetGracefulShutdown records a graceful shutdown request in the named domain's metadata,
// in its running and its persistent definition alike, so it survives restarts of the agent
// and of libvirt.
func (c *Conn) SetGracefulShutdown(name string, gs GracefulShutdown) error {
	return c.setGracefulShutdown(name, &gs)
}

// ClearGracefulShutdown removes the graceful shutdown record. The record is the pod's, not the
// guest's, but metadata travels with a migrating domain: the launcher that receives the guest
// clears what the launcher it came from was told.
func (c *Conn) ClearGracefulShutdown(name string) error {
	return c.setGracefulShutdown(name, nil)
}

func (c *Conn) setGracefulShutdown(name string, gs *GracefulShutdown) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	current, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNamespace, libvirt.DOMAIN_AFFECT_CURRENT)
	if err != nil {
		return fmt.Errorf("reading the metadata of domain %q: %w", name, err)
	}
	m, err := parseMetadata(current)
	if err != nil {
		return err
	}
	m.GracefulShutdown = gs
	updated, err := marshalMetadata(m)
	if err != nil {
		return err
	}
	active, err := dom.IsActive()
	if err != nil {
		return fmt.Errorf("checking whether domain %q runs: %w", name, err)
	}
	persistent, err := dom.IsPersistent()
	if err != nil {
		return fmt.Errorf("checking whether domain %q is persistent: %w", name, err)
	}
	if err := dom.SetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, updated, metadataPrefix, MetadataNamespace, metadataImpact(active, persistent)); err != nil {
		return fmt.Errorf("writing the graceful shutdown record of domain %q: %w", name, err)
	}
	return nil
}

// metadataImpact is which definitions of a domain a metadata change goes to: the running
// one and the persistent one where they exist. libvirt refuses a change to a definition
// the domain does not have (a transient domain has no persistent one, a stopped domain no live one).
func metadataImpact(active, persistent bool) libvirt.DomainModificationImpact {
	var impact libvirt.DomainModificationImpact
	if active {
		impact |= libvirt.DOMAIN_AFFECT_LIVE
	}
	if persistent {
		impact |= libvirt.DOMAIN_AFFECT_CONFIG
	}
	return impact
}
