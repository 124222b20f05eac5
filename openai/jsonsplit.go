package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The request decoders take a body apart one level at a time: an object's
// members, an array's elements, each kept as raw JSON for its own decoder.
// encoding/json does that through reflection, with a validating pass over
// the bytes at every level and a copy of every raw value; for a small
// request that was most of its decoding time (BenchmarkDecodeChatRequest),
// and all of it sits between a request's arrival and the runtime starting
// on it. The body is validated once (validJSON), so splitting only needs
// to find where each value ends. FuzzSplitJSON checks every result against
// encoding/json's.

// splitObject returns the members of raw, a valid JSON object, as
// encoding/json's map[string]json.RawMessage decoding would hold them: keys
// unquoted, the last of duplicate keys kept (in the place of the first),
// values without surrounding whitespace. The values share raw's bytes,
// capped so that an append copies, and so do the keys that need no
// unescaping (nearly all): no allocation per member. It returns nil if raw
// is no object.
func splitObject(raw []byte) object {
	// Room for the members a body of this size can hold, up to a
	// request's usual few (a member takes 6 bytes at least: "k":1,), so
	// that the slice is allocated once rather than grown member by member.
	members := make(object, 0, min(len(raw)/6+1, 8))
	var index map[string]int // past dedupScan members: a key's place
	ok := eachItem(raw, '{', '}', func(i int) int {
		k := i
		i = skipString(raw, i)
		key := keyBytes(raw[k:i])
		i = skipSpace(raw, skipSpace(raw, i)+1) // past the colon
		v := i
		i = skipValue(raw, i)
		at := -1
		switch {
		case index != nil:
			if j, dup := index[string(key)]; dup {
				at = j
			}
		default:
			for j := range members {
				if string(members[j].key) == string(key) {
					at = j
					break
				}
			}
		}
		if at >= 0 {
			members[at].raw = raw[v:i:i]
			return i
		}
		members = append(members, member{key: key, raw: raw[v:i:i]})
		// A long object finds its duplicates through a map: comparing each
		// key with every earlier one would make a body of many keys cost
		// their number squared.
		if len(members) == dedupScan {
			index = make(map[string]int, 2*dedupScan)
			for j := range members {
				index[string(members[j].key)] = j
			}
		} else if index != nil {
			index[string(key)] = len(members) - 1
		}
		return i
	})
	if !ok {
		return nil
	}
	return members
}

// dedupScan is the number of members up to which splitObject finds a
// duplicate key by comparing: the objects of a request hold a handful.
const dedupScan = 16

// keyBytes is the decoded key of quoted, a valid JSON string: its own
// bytes when it has no escape and is valid UTF-8 (mustString's case),
// otherwise a decoded copy.
func keyBytes(quoted []byte) []byte {
	if len(quoted) >= 2 {
		if s := quoted[1 : len(quoted)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			return s[:len(s):len(s)]
		}
	}
	return []byte(mustString(quoted))
}

// splitArray returns the elements of raw, a valid JSON array, as
// encoding/json's []json.RawMessage decoding would (empty, not nil, for
// []), sharing raw's bytes like splitObject.
func splitArray(raw []byte) []json.RawMessage {
	a := []json.RawMessage{}
	ok := eachItem(raw, '[', ']', func(i int) int {
		end := skipValue(raw, i)
		a = append(a, raw[i:end:end])
		return end
	})
	if !ok {
		return nil
	}
	return a
}

// eachItem calls item with the index of each member or element of raw, a
// valid JSON value that must open with open and close with close; item
// returns the index after it. It reports false if raw is no such value.
func eachItem(raw []byte, open, close byte, item func(i int) int) bool {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != open {
		return false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == close {
		return true
	}
	for i < len(raw) {
		i = skipSpace(raw, item(i))
		if i >= len(raw) || raw[i] != ',' {
			break // the closing delimiter
		}
		i = skipSpace(raw, i+1)
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string that starts at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte cannot end the string
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the value that starts at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	// A number or a literal runs to the next delimiter.
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}
