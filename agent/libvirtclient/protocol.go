package libvirtclient

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// MaxMessage bounds one message of the protocol, in bytes, newline included. The largest a
// healthy daemon's replies make is a few KiB (job statistics, a domain's metadata); a message over
// the bound ends the connection.
const MaxMessage = 64 << 10

// Operations of the protocol, one per domain.Conn method the agent uses, and connect and cancel.
const (
	opConnect            = "connect"
	opCancel             = "cancel"
	opLookup             = "lookup"
	opMetadata           = "metadata"
	opState              = "state"
	opDomainNames        = "domain-names"
	opShutdown           = "shutdown"
	opDestroy            = "destroy"
	opMigrate            = "migrate"
	opJobStats           = "job-stats"
	opStartPostCopy      = "start-post-copy"
	opSuspend            = "suspend"
	opResume             = "resume"
	opLoadCapabilities   = "load-capabilities"
	opStartDirtyRateCalc = "start-dirty-rate"
	opDirtyRate          = "dirty-rate"
)

// request is a line from the agent to the child. ID is unique among the connection's requests;
// a cancel names the request it cancels in Target.
type request struct {
	ID      uint64                 `json:"id"`
	Op      string                 `json:"op"`
	Name    string                 `json:"name,omitempty"`
	Session bool                   `json:"session,omitempty"`
	Migrate *domain.MigrateOptions `json:"migrate,omitempty"`
	Period  time.Duration          `json:"period,omitempty"`
	Mode    domain.DirtyRateMode   `json:"mode,omitempty"`
	Target  uint64                 `json:"target,omitempty"`
}

// reply is a line from the child to the agent: the answer to request ID, or (ID 0) a lifecycle
// event of one of the connection's domains.
type reply struct {
	ID     uint64          `json:"id,omitempty"`
	Error  *wireError      `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Event  *domain.Event   `json:"event,omitempty"`
}

// wireError is a failed call: its message, and what the agent tells apart by errors.Is.
type wireError struct {
	Message   string `json:"message"`
	NotFound  bool   `json:"notFound,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"`
}

// stateResult and dirtyRateResult are the results of the calls that return two values.
type stateResult struct {
	State  domain.State  `json:"state"`
	Reason domain.Reason `json:"reason"`
}

type dirtyRateResult struct {
	Rate uint64 `json:"rate"`
	OK   bool   `json:"ok"`
}

// ErrMessageTooLong ends a connection whose peer sent a message over MaxMessage.
var ErrMessageTooLong = fmt.Errorf("a message of the libvirt client's protocol is over %d bytes", MaxMessage)

// lineReader reads the protocol's newline-delimited messages, none over MaxMessage.
type lineReader struct{ r *bufio.Reader }

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, MaxMessage)}
}

// next returns the next message without its newline; it is valid until the next call.
func (l *lineReader) next() ([]byte, error) {
	line, err := l.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, ErrMessageTooLong
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return line[:len(line)-1], nil
}

// encodeLine is v as one message, newline included, or an error if it would be over MaxMessage.
func encodeLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b)+1 > MaxMessage {
		return nil, ErrMessageTooLong
	}
	return append(b, '\n'), nil
}
