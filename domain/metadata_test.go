package domain

import (
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"
)

func TestMetadataRoundTrip(t *testing.T) {
	signal := time.Date(2026, 11, 22, 10, 0, 0, 5, time.UTC)
	tests := []struct {
		name string
		m    Metadata
	}{
		{"new domain", Metadata{Namespace: "default", Name: "vm", UID: "0f5a"}},
		{"shutdown requested", Metadata{Namespace: "default", Name: "vm", UID: "0f5a",
			GracefulShutdown: &GracefulShutdown{SignalTime: signal, Deadline: signal.Add(30 * time.Second)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := marshalMetadata(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(s, `xmlns="`+MetadataNamespace+`"`) {
				t.Errorf("marshalMetadata() = %s, want it in namespace %s", s, MetadataNamespace)
			}
			got, err := parseMetadata(s)
			if err != nil {
				t.Fatal(err)
			}
			if got.Namespace != tt.m.Namespace || got.Name != tt.m.Name || got.UID != tt.m.UID ||
				(got.GracefulShutdown == nil) != (tt.m.GracefulShutdown == nil) {
				t.Fatalf("parseMetadata(marshalMetadata()) = %+v, want %+v", got, tt.m)
			}
			if gs := got.GracefulShutdown; gs != nil && (!gs.SignalTime.Equal(signal) || !gs.Deadline.Equal(signal.Add(30*time.Second))) {
				t.Errorf("graceful shutdown = %+v, want %+v", gs, tt.m.GracefulShutdown)
			}
		})
	}
}

func TestParseMetadataAsLibvirtReturnsIt(t *testing.T) {
	tests := []struct {
		name    string
		xml     string
		want    Metadata
		wantErr bool
	}{
		{
			name: "namespace stripped",
			xml:  "<vmi>\n  <namespace>default</namespace>\n  <name>vm</name>\n  <uid>0f5a</uid>\n</vmi>\n",
			want: Metadata{Namespace: "default", Name: "vm", UID: "0f5a"},
		},
		{
			name: "prefixed",
			xml:  `<lifeboat:vmi xmlns:lifeboat="https://lifeboat.dev/domain/1"><lifeboat:namespace>default</lifeboat:namespace><lifeboat:name>vm</lifeboat:name><lifeboat:uid>0f5a</lifeboat:uid></lifeboat:vmi>`,
			want: Metadata{Namespace: "default", Name: "vm", UID: "0f5a"},
		},
		{name: "another element", xml: "<other/>", wantErr: true},
		{name: "not XML", xml: "vmi", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMetadata(tt.xml)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseMetadata() error = %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parseMetadata() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMetadataImpact(t *testing.T) {
	tests := []struct {
		name               string
		active, persistent bool
		want               libvirt.DomainModificationImpact
	}{
		{"running persistent domain", true, true, libvirt.DOMAIN_AFFECT_LIVE | libvirt.DOMAIN_AFFECT_CONFIG},
		{"running transient domain", true, false, libvirt.DOMAIN_AFFECT_LIVE},
		{"stopped persistent domain", false, true, libvirt.DOMAIN_AFFECT_CONFIG},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := metadataImpact(tt.active, tt.persistent); got != tt.want {
				t.Errorf("metadataImpact() = %v, want %v", got, tt.want)
			}
		})
	}
}
