package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// inputEvent encodes a struct input_event as the kernel hands it to readers.
func inputEvent(typ, code uint16, value int32) []byte {
	b := make([]byte, inputEventSize)
	binary.LittleEndian.PutUint16(b[16:], typ)
	binary.LittleEndian.PutUint16(b[18:], code)
	binary.LittleEndian.PutUint32(b[20:], uint32(value))
	return b
}

func TestIsPowerPress(t *testing.T) {
	const evSyn = 0
	tests := []struct {
		name  string
		event []byte
		want  bool
	}{
		{name: "power key down", event: inputEvent(evKey, keyPower, 1), want: true},
		{name: "power key up", event: inputEvent(evKey, keyPower, 0)},
		{name: "power key repeat", event: inputEvent(evKey, keyPower, 2)},
		{name: "another key", event: inputEvent(evKey, 28, 1)},
		{name: "sync", event: inputEvent(evSyn, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isPowerPress(tt.event); got != tt.want {
				t.Errorf("isPowerPress() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestWaitForPowerKey(t *testing.T) {
	var stream bytes.Buffer
	stream.Write(inputEvent(evKey, 28, 1))
	stream.Write(inputEvent(0, 0, 0))
	stream.Write(inputEvent(evKey, keyPower, 1))
	if err := waitForPowerKey(&stream); err != nil {
		t.Fatalf("waitForPowerKey() = %v, want the press found", err)
	}

	stream.Reset()
	stream.Write(inputEvent(evKey, 28, 1))
	if err := waitForPowerKey(&stream); !errors.Is(err, io.EOF) {
		t.Fatalf("waitForPowerKey() without a press = %v, want EOF", err)
	}
}
