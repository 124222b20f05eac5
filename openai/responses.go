package openai

import (
	"encoding/base64"

	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/llm"
)

// ResponseEncoder builds one answer of the Responses API as the generation
// runs: it keeps the output items (message, reasoning, function calls) and
// appends the server-sent events of a streamed response, each numbered by
// sequence_number from 0. For a response that is not streamed it only
// keeps the items, and AppendResponse encodes the whole object at the end.
//
// A stream is: Begin, then any Text, Reasoning and ToolCalls, then Finish;
// a failure after Begin is reported with Fail instead of Finish. The text
// path appends to dst and to the item's text and allocates nothing when
// both have room. A ResponseEncoder is for one response and one goroutine.
type ResponseEncoder struct {
	sse  bool
	head string // `{"id":…,"object":"response","created_at":…,`
	echo string // the request's settings, model included, comma-terminated
	seq  int64
	// items are the output so far; open is the index of the one taking
	// deltas (a message or reasoning), -1 when none.
	items []responseItem
	open  int

	status     string // in_progress, completed, incomplete, failed
	incomplete string // incomplete_details.reason
	err        *Error
	usage      *Usage

	// sealer seals each reasoning item's thinking into its
	// encrypted_content (include reasoning.encrypted_content), or nil.
	sealer Sealer
	// logprobs: the text's logprobs go with it (include
	// message.output_text.logprobs).
	logprobs bool
}

type itemKind uint8

const (
	itemMessage itemKind = iota
	itemReasoning
	itemFunctionCall
)

// responseItem is one output item.
type responseItem struct {
	kind   itemKind
	id     string
	status string       // in_progress, completed, incomplete
	text   []byte       // a message's or reasoning's text
	call   llm.ToolCall // a function call; ID is its call_id
	lps    []llm.TokenLogprob
	sealed string // a reasoning's encrypted_content, once sealed
}

// NewResponseEncoder starts the response id, created at createdAt (Unix
// seconds), to req; stream selects the server-sent events.
func NewResponseEncoder(req *ResponsesRequest, id string, createdAt int64, stream bool) *ResponseEncoder {
	h := make([]byte, 0, 64+len(id))
	h = append(h, `{"id":`...)
	h = appendString(h, id)
	h = append(h, `,"object":"response","created_at":`...)
	h = appendInt(h, createdAt)
	h = append(h, ',')
	return &ResponseEncoder{sse: stream, head: string(h), echo: req.echo, open: -1, status: "in_progress",
		sealer: req.sealer, logprobs: req.logprobs}
}

// NewResponseID returns "resp_" followed by 40 random base62 characters.
func NewResponseID() string { return ids.New("resp_", 40) }

// Begin appends response.created and response.in_progress.
func (r *ResponseEncoder) Begin(dst []byte) []byte {
	if !r.sse {
		return dst
	}
	dst = r.event(dst, "response.created")
	dst = r.appendResponseMember(dst)
	dst = r.event(dst, "response.in_progress")
	return r.appendResponseMember(dst)
}

// Text adds a piece of the answer: a response.output_text.delta, after the
// events that open a message item if none is open.
func (r *ResponseEncoder) Text(dst []byte, s string) []byte {
	return r.delta(dst, itemMessage, "response.output_text.delta", s, nil)
}

// TextLogprobs is Text with the logprobs of the piece's tokens, for a
// request that asked for them (without, they are dropped).
func (r *ResponseEncoder) TextLogprobs(dst []byte, s string, lp []llm.TokenLogprob) []byte {
	return r.delta(dst, itemMessage, "response.output_text.delta", s, lp)
}

// Reasoning adds a piece of the model's thinking: a
// response.reasoning_text.delta in a reasoning item.
func (r *ResponseEncoder) Reasoning(dst []byte, s string) []byte {
	return r.delta(dst, itemReasoning, "response.reasoning_text.delta", s, nil)
}

// delta adds s (with the logprobs lp of its tokens) to the open item of
// kind k, opening one if needed.
func (r *ResponseEncoder) delta(dst []byte, k itemKind, typ, s string, lp []llm.TokenLogprob) []byte {
	dst = r.openItem(dst, k)
	it := &r.items[r.open]
	it.text = append(it.text, s...)
	if !r.logprobs {
		lp = nil
	}
	it.lps = append(it.lps, lp...)
	if !r.sse {
		return dst
	}
	dst = r.event(dst, typ)
	dst = r.appendItemRef(dst, r.open)
	dst = append(dst, `,"content_index":0,"delta":`...)
	dst = appendString(dst, s)
	if k == itemMessage {
		dst = append(dst, `,"logprobs":`...)
		dst = appendLogprobList(dst, lp)
	}
	return append(dst, "}\n\n"...)
}

// ToolCalls adds complete function calls, each an item of its own whose
// arguments come in one delta. A call without an ID gets a fresh one.
func (r *ResponseEncoder) ToolCalls(dst []byte, calls []llm.ToolCall) []byte {
	dst = r.closeItem(dst, "completed")
	for _, c := range calls {
		if c.ID == "" {
			c.ID = NewToolCallID()
		}
		if len(c.Arguments) == 0 {
			c.Arguments = []byte("{}")
		}
		r.items = append(r.items, responseItem{kind: itemFunctionCall, id: ids.New("fc_", 40), status: "in_progress", call: c})
		if !r.sse {
			r.items[len(r.items)-1].status = "completed"
			continue
		}
		i := len(r.items) - 1
		dst = r.itemEvent(dst, "response.output_item.added", i, true)
		dst = r.event(dst, "response.function_call_arguments.delta")
		dst = r.appendItemRef(dst, i)
		dst = append(dst, `,"delta":`...)
		dst = appendString(dst, c.Arguments)
		dst = append(dst, "}\n\n"...)
		dst = r.event(dst, "response.function_call_arguments.done")
		dst = r.appendItemRef(dst, i)
		dst = append(dst, `,"name":`...)
		dst = appendString(dst, c.Name)
		dst = append(dst, `,"arguments":`...)
		dst = appendString(dst, c.Arguments)
		dst = append(dst, "}\n\n"...)
		r.items[i].status = "completed"
		dst = r.itemEvent(dst, "response.output_item.done", i, false)
	}
	return dst
}

// Finish ends the response: completed, or incomplete for the reason
// ("max_output_tokens" when the output ran out of tokens) if not empty.
// It appends response.completed or response.incomplete with the whole
// response.
func (r *ResponseEncoder) Finish(dst []byte, incomplete string, u Usage) []byte {
	r.status, r.incomplete, r.usage = "completed", incomplete, &u
	itemStatus := "completed"
	if incomplete != "" {
		r.status, itemStatus = "incomplete", "incomplete"
	}
	dst = r.closeItem(dst, itemStatus)
	if !r.sse {
		return dst
	}
	dst = r.event(dst, "response."+r.status)
	return r.appendResponseMember(dst)
}

// Fail ends the response with a failure after Begin: response.failed, its
// error set. The item being written is left incomplete.
func (r *ResponseEncoder) Fail(dst []byte, e *Error) []byte {
	if r.open >= 0 {
		r.items[r.open].status = "incomplete"
		r.open = -1
	}
	r.status, r.err = "failed", e
	if !r.sse {
		return dst
	}
	dst = r.event(dst, "response.failed")
	return r.appendResponseMember(dst)
}

// AppendResponse appends the response object as it stands: after Finish,
// the answer to a request that is not streamed.
func (r *ResponseEncoder) AppendResponse(dst []byte) []byte {
	dst = append(dst, r.head...)
	dst = append(dst, `"status":`...)
	dst = appendString(dst, r.status)
	dst = append(dst, `,"background":false,"error":`...)
	if r.err != nil {
		code := r.err.Code
		if code == "" {
			code = "server_error"
		}
		dst = append(dst, `{"code":`...)
		dst = appendString(dst, code)
		dst = append(dst, `,"message":`...)
		dst = appendString(dst, r.err.Message)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"incomplete_details":`...)
	if r.incomplete != "" {
		dst = append(dst, `{"reason":`...)
		dst = appendString(dst, r.incomplete)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, ',')
	dst = append(dst, r.echo...)
	dst = append(dst, `"output":[`...)
	for i := range r.items {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = r.appendItem(dst, i, false)
	}
	dst = append(dst, ']')
	if r.status != "in_progress" {
		// output_text is what the SDKs compute from the message items;
		// sent too, for clients that read the JSON as it is. Not in the
		// first events: an SDK that accumulates the stream onto the
		// response of response.created would keep it empty.
		dst = append(dst, `,"output_text":"`...)
		for i := range r.items {
			if r.items[i].kind == itemMessage {
				// The texts joined in one string: each without its quotes.
				start := len(dst)
				dst = appendString(dst, r.items[i].text)
				dst = append(dst[:start], dst[start+1:len(dst)-1]...)
			}
		}
		dst = append(dst, '"')
	}
	dst = append(dst, `,"usage":`...)
	if u := r.usage; u != nil {
		dst = append(dst, `{"input_tokens":`...)
		dst = appendInt(dst, int64(u.Prompt))
		dst = append(dst, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		dst = appendInt(dst, int64(u.Completion))
		dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":`...)
		dst = appendInt(dst, int64(u.Reasoning))
		dst = append(dst, `},"total_tokens":`...)
		dst = appendInt(dst, int64(u.Prompt)+int64(u.Completion))
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, '}')
}

// event appends the start of an event of type typ, up to and including
// its sequence number.
func (r *ResponseEncoder) event(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	dst = append(dst, `","sequence_number":`...)
	dst = appendInt(dst, r.seq)
	r.seq++
	return dst
}

// appendResponseMember ends an event with the whole response.
func (r *ResponseEncoder) appendResponseMember(dst []byte) []byte {
	dst = append(dst, `,"response":`...)
	dst = r.AppendResponse(dst)
	return append(dst, "}\n\n"...)
}

// appendItemRef appends item i's item_id and output_index.
func (r *ResponseEncoder) appendItemRef(dst []byte, i int) []byte {
	dst = append(dst, `,"item_id":`...)
	dst = appendString(dst, r.items[i].id)
	dst = append(dst, `,"output_index":`...)
	return appendInt(dst, int64(i))
}

// itemEvent appends an output_item event about item i.
func (r *ResponseEncoder) itemEvent(dst []byte, typ string, i int, fresh bool) []byte {
	dst = r.event(dst, typ)
	dst = append(dst, `,"output_index":`...)
	dst = appendInt(dst, int64(i))
	dst = append(dst, `,"item":`...)
	dst = r.appendItem(dst, i, fresh)
	return append(dst, "}\n\n"...)
}

// partEvent appends a content_part event about the open item.
func (r *ResponseEncoder) partEvent(dst []byte, typ string, fresh bool) []byte {
	dst = r.event(dst, typ)
	dst = r.appendItemRef(dst, r.open)
	dst = append(dst, `,"content_index":0,"part":`...)
	dst = r.appendPart(dst, r.open, fresh)
	return append(dst, "}\n\n"...)
}

// openItem makes an item of kind k the open one, closing another.
func (r *ResponseEncoder) openItem(dst []byte, k itemKind) []byte {
	if r.open >= 0 && r.items[r.open].kind == k {
		return dst
	}
	dst = r.closeItem(dst, "completed")
	prefix := "msg_"
	if k == itemReasoning {
		prefix = "rs_"
	}
	r.items = append(r.items, responseItem{kind: k, id: ids.New(prefix, 40), status: "in_progress"})
	r.open = len(r.items) - 1
	if !r.sse {
		return dst
	}
	dst = r.itemEvent(dst, "response.output_item.added", r.open, true)
	return r.partEvent(dst, "response.content_part.added", true)
}

// closeItem ends the open item, if any, with status.
func (r *ResponseEncoder) closeItem(dst []byte, status string) []byte {
	if r.open < 0 {
		return dst
	}
	it := &r.items[r.open]
	it.status = status
	if r.sse {
		typ := "response.output_text.done"
		if it.kind == itemReasoning {
			typ = "response.reasoning_text.done"
		}
		dst = r.event(dst, typ)
		dst = r.appendItemRef(dst, r.open)
		dst = append(dst, `,"content_index":0,"text":`...)
		dst = appendString(dst, it.text)
		if it.kind == itemMessage {
			dst = append(dst, `,"logprobs":`...)
			dst = appendLogprobList(dst, it.lps)
		}
		dst = append(dst, "}\n\n"...)
		dst = r.partEvent(dst, "response.content_part.done", false)
		dst = r.itemEvent(dst, "response.output_item.done", r.open, false)
	}
	r.open = -1
	return dst
}

// appendItem appends output item i; fresh is the item as first announced,
// before its content.
func (r *ResponseEncoder) appendItem(dst []byte, i int, fresh bool) []byte {
	it := &r.items[i]
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, it.id)
	switch it.kind {
	case itemMessage:
		dst = append(dst, `,"type":"message","status":`...)
		dst = appendString(dst, it.status)
		dst = append(dst, `,"role":"assistant","content":[`...)
		if !fresh {
			dst = r.appendPart(dst, i, false)
		}
		return append(dst, "]}"...)
	case itemReasoning:
		dst = append(dst, `,"type":"reasoning","status":`...)
		dst = appendString(dst, it.status)
		dst = append(dst, `,"summary":[],"content":[`...)
		if !fresh {
			dst = r.appendPart(dst, i, false)
		}
		dst = append(dst, ']')
		if r.sealer != nil && !fresh {
			if it.sealed == "" {
				it.sealed = base64.StdEncoding.EncodeToString(r.sealer.Seal(nil, it.text, reasoningAD))
			}
			dst = append(dst, `,"encrypted_content":`...)
			dst = appendString(dst, it.sealed)
		}
		return append(dst, '}')
	default:
		dst = append(dst, `,"type":"function_call","status":`...)
		dst = appendString(dst, it.status)
		dst = append(dst, `,"call_id":`...)
		dst = appendString(dst, it.call.ID)
		dst = append(dst, `,"name":`...)
		dst = appendString(dst, it.call.Name)
		dst = append(dst, `,"arguments":`...)
		if fresh {
			dst = append(dst, `""`...)
		} else {
			dst = appendString(dst, it.call.Arguments)
		}
		return append(dst, '}')
	}
}

// appendPart appends the content part of item i (a message or reasoning).
func (r *ResponseEncoder) appendPart(dst []byte, i int, fresh bool) []byte {
	it := &r.items[i]
	var text []byte
	if !fresh {
		text = it.text
	}
	if it.kind == itemReasoning {
		dst = append(dst, `{"type":"reasoning_text","text":`...)
		dst = appendString(dst, text)
		return append(dst, '}')
	}
	dst = append(dst, `{"type":"output_text","text":`...)
	dst = appendString(dst, text)
	dst = append(dst, `,"annotations":[],"logprobs":`...)
	if fresh {
		return append(dst, "[]}"...)
	}
	dst = appendLogprobList(dst, it.lps)
	return append(dst, '}')
}
