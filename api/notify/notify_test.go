package notify

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func validMessage() *Message {
	return &Message{
		Kind:                  KindGracefulShutdown,
		VMI:                   VMIRef{Namespace: "default", Name: "vm1", UID: "3f1c"},
		Time:                  time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
		PodGracePeriodSeconds: 45,
	}
}

func frame(version, reserved byte, length int, body string) []byte {
	b := []byte{version, reserved, 0, 0}
	binary.BigEndian.PutUint16(b[2:], uint16(length))
	return append(b, body...)
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := validMessage()
	if err := Write(&buf, want); err != nil {
		t.Fatal(err)
	}
	if err := Write(&buf, &Message{Kind: KindDomainGone, VMI: want.VMI, Time: want.Time, Reason: "guest powered off"}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != want.Kind || got.VMI != want.VMI || !got.Time.Equal(want.Time) || got.PodGracePeriodSeconds != 45 {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got, err := Read(&buf); err != nil || got.Kind != KindDomainGone || got.Reason != "guest powered off" {
		t.Errorf("second frame: %+v, %v", got, err)
	}
	if _, err := Read(&buf); err != io.EOF {
		t.Errorf("after the last frame: got %v, want io.EOF", err)
	}
}

func TestReadRejectsMalformedFrames(t *testing.T) {
	good := `{"kind":"Hello","vmi":{"namespace":"ns","name":"vm","uid":"u"},"time":"2026-11-22T03:00:00Z"}`
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty stream", nil, io.EOF},
		{"header cut short", []byte{Version, 0}, io.ErrUnexpectedEOF},
		{"wrong version", frame(2, 0, len(good), good), ErrVersion},
		{"version zero", frame(0, 0, len(good), good), ErrVersion},
		{"reserved byte set", frame(Version, 7, len(good), good), ErrReserved},
		{"zero length", frame(Version, 0, 0, ""), ErrEmpty},
		{"oversized length", frame(Version, 0, MaxBody+1, ""), ErrTooLarge},
		{"maximum length field", frame(Version, 0, 0xffff, ""), ErrTooLarge},
		{"body cut short", frame(Version, 0, len(good)+10, good), io.ErrUnexpectedEOF},
		{"not JSON", frame(Version, 0, 5, "hello"), ErrMalformed},
		{"JSON array", frame(Version, 0, 2, "[]"), ErrMalformed},
		{"unknown field", frame(Version, 0, 40, `{"kind":"Hello","sneaky":1,"vmi":{}}    `), ErrMalformed},
		{"trailing data", frame(Version, 0, len(good)+2, good+"{}"), ErrMalformed},
		{"unknown kind", frame(Version, 0, len(strings.Replace(good, "Hello", "Reboot", 1)), strings.Replace(good, "Hello", "Reboot", 1)), ErrMalformed},
		{"no UID", frame(Version, 0, len(strings.Replace(good, `"uid":"u"`, `"uid":""`, 1)), strings.Replace(good, `"uid":"u"`, `"uid":""`, 1)), ErrMalformed},
		{"no time", frame(Version, 0, len(`{"kind":"Hello","vmi":{"namespace":"ns","name":"vm","uid":"u"}}`), `{"kind":"Hello","vmi":{"namespace":"ns","name":"vm","uid":"u"}}`), ErrMalformed},
		{"negative grace", frame(Version, 0, len(good[:len(good)-1]+`,"podGracePeriodSeconds":-1}`), good[:len(good)-1]+`,"podGracePeriodSeconds":-1}`), ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.frame))
			if !errors.Is(err, tc.want) {
				t.Errorf("Read = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWriteRefusesInvalidMessages(t *testing.T) {
	m := validMessage()
	m.Kind = "Reboot"
	if err := Write(io.Discard, m); !errors.Is(err, ErrMalformed) {
		t.Errorf("Write of an unknown kind = %v, want ErrMalformed", err)
	}
	m = validMessage()
	m.Reason = strings.Repeat("x", MaxBody)
	if err := Write(io.Discard, m); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Write of an oversized message = %v, want ErrTooLarge", err)
	}
}

// FuzzRead: whatever arrives, Read returns a valid message or an error; it never panics and
// never reads past the frame it reports.
func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	_ = Write(&buf, validMessage())
	f.Add(buf.Bytes())
	f.Add(frame(Version, 0, 0xffff, ""))
	f.Add(frame(Version, 0, 2, "{}"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		m, err := Read(r)
		if err != nil {
			return
		}
		if verr := m.Validate(); verr != nil {
			t.Fatalf("Read returned an invalid message: %v", verr)
		}
		consumed := len(data) - r.Len()
		if consumed > headerLen+MaxBody {
			t.Fatalf("Read consumed %d bytes, more than one frame can hold", consumed)
		}
		var again bytes.Buffer
		if err := Write(&again, m); err != nil {
			t.Fatalf("a message Read accepted cannot be written back: %v", err)
		}
	})
}

func TestAMigratedReportCarriesItsDowntime(t *testing.T) {
	var buf bytes.Buffer
	m := validMessage()
	m.Kind, m.PodGracePeriodSeconds, m.DowntimeMilliseconds = KindMigrated, 0, 87
	if err := Write(&buf, m); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(&buf); err != nil || got.Kind != KindMigrated || got.DowntimeMilliseconds != 87 {
		t.Errorf("got %+v, %v; want a Migrated report of 87 ms", got, err)
	}
	m.DowntimeMilliseconds = -1
	if err := Write(io.Discard, m); !errors.Is(err, ErrMalformed) {
		t.Errorf("Write of a negative downtime = %v, want ErrMalformed", err)
	}
}

func TestAGuestMemoryAnswerCarriesItsFigureAndNoOtherMessageDoes(t *testing.T) {
	var buf bytes.Buffer
	m := validMessage()
	m.Kind, m.PodGracePeriodSeconds, m.GuestMemoryResidentBytes, m.GuestMemoryBytes = KindGuestMemory, 0, 300<<20, 1<<30
	if err := Write(&buf, m); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(&buf); err != nil || got.Kind != KindGuestMemory || got.GuestMemoryResidentBytes != 300<<20 || got.GuestMemoryBytes != 1<<30 {
		t.Errorf("got %+v, %v; want a GuestMemory answer of 300 MiB of 1 GiB", got, err)
	}
	m.GuestMemoryResidentBytes = 2 << 30
	if err := Write(io.Discard, m); !errors.Is(err, ErrMalformed) {
		t.Errorf("Write of more resident than the guest has = %v, want ErrMalformed", err)
	}
	m.GuestMemoryResidentBytes, m.GuestMemoryBytes = 0, 0
	if err := Write(io.Discard, m); !errors.Is(err, ErrMalformed) {
		t.Errorf("Write of a GuestMemory answer without the guest's size = %v, want ErrMalformed", err)
	}
	body := `{"kind":"DomainStarted","vmi":{"namespace":"ns","name":"vm","uid":"u"},"time":"2026-11-22T03:00:00Z","guestMemoryResidentBytes":1}`
	if _, err := Read(bytes.NewReader(frame(Version, 0, len(body), body))); !errors.Is(err, ErrMalformed) {
		t.Errorf("Read of a DomainStarted report with a guest memory figure = %v, want ErrMalformed", err)
	}
}
