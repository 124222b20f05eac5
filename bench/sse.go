package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// SSEReader reads Server-Sent Events. It is hand-written rather than taken
// from an SSE library because the load generator parses every token of
// every stream on the same cores as the relay it measures: it allocates
// nothing per event and hands out views into its buffer.
type SSEReader struct {
	br   *bufio.Reader
	data []byte // the current event's data lines, joined with \n
	line []byte // a line longer than the buffer, assembled
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{br: bufio.NewReaderSize(r, 4096)}
}

// Next returns the data of the next event that has data. The slice is valid
// until the next call. At the end of the input it returns io.EOF; an event
// cut off by the end of input is dropped, as the SSE spec says.
func (s *SSEReader) Next() ([]byte, error) {
	s.data = s.data[:0]
	hasData := false
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("read event stream: %w", err)
		}
		if len(line) == 0 { // blank line: dispatch
			if hasData {
				return s.data, nil
			}
			continue
		}
		if line[0] == ':' { // comment
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		if string(field) != "data" {
			continue // event, id, retry: not needed to count tokens
		}
		if hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		hasData = true
	}
}

// readLine returns the next line without its CR, LF or CRLF ending.
func (s *SSEReader) readLine() ([]byte, error) {
	line, err := s.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		s.line = append(s.line[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = s.br.ReadSlice('\n')
			s.line = append(s.line, line...)
		}
		line = s.line
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// Chunk is what the load generator needs from one streamed chat chunk.
type Chunk struct {
	// ContentLen is the length of the delta content as it appears in the
	// JSON string (escapes counted as written); 0 for no content.
	ContentLen int
	// Finished is set when the chunk carries a finish_reason.
	Finished bool
	// Error is set when the event is an error object instead of a chunk.
	Error bool
	// Done is set for the [DONE] sentinel.
	Done bool
}

var (
	keyContent = []byte(`"content"`)
	keyFinish  = []byte(`"finish_reason"`)
	keyError   = []byte(`"error"`)
	doneData   = []byte("[DONE]")
)

// ClassifyChunk scans an OpenAI chat.completion.chunk without decoding it:
// a full JSON decode per token would cost the load generator more CPU than
// the relay under test spends. It relies only on JSON syntax: a key such
// as "content" followed by a colon cannot occur inside a string value,
// where its quotes would be escaped.
func ClassifyChunk(data []byte) Chunk {
	if bytes.Equal(data, doneData) {
		return Chunk{Done: true}
	}
	var c Chunk
	if v := valueAfter(data, keyContent); len(v) > 1 && v[0] == '"' {
		c.ContentLen = stringLen(v)
	}
	if v := valueAfter(data, keyFinish); len(v) > 0 && v[0] == '"' {
		c.Finished = true
	}
	if v := valueAfter(data, keyError); len(v) > 0 && v[0] != 'n' {
		c.Error = true
	}
	return c
}

// valueAfter returns data from the value of the first key occurrence that is
// followed by a colon, or nil.
func valueAfter(data, key []byte) []byte {
	for {
		i := bytes.Index(data, key)
		if i < 0 {
			return nil
		}
		data = data[i+len(key):]
		j := skipSpace(data, 0)
		if j < len(data) && data[j] == ':' {
			return data[skipSpace(data, j+1):]
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringLen is the length of the body of the JSON string literal that v
// starts with (v[0] == '"'), or 0 if it is not terminated.
func stringLen(v []byte) int {
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i - 1
		}
	}
	return 0
}

// Reset makes s read a new stream, keeping its buffers.
func (s *SSEReader) Reset(r io.Reader) {
	s.br.Reset(r)
	s.data = s.data[:0]
}
