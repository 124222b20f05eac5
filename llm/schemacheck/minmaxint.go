package schemacheck

import (
	"math"
	"strconv"
	"strings"
)

const (
	minInt64 = math.MinInt64
	maxInt64 = math.MaxInt64
)

// minMaxInt writes the grammar the converter writes for an integer from
// lo to hi (math.MinInt64 and math.MaxInt64 for no bound), a port of its
// _build_min_max_int: the grammar's size is estimated with it, and the
// port is exact so an integer's bounds cost what they do.
func minMaxInt(lo, hi int64, out *strings.Builder, decimalsLeft int, topLevel bool) {
	hasMin, hasMax := lo != minInt64, hi != maxInt64
	digitRange := func(from, to byte) {
		out.WriteByte('[')
		if from == to {
			out.WriteByte(from)
		} else {
			out.WriteByte(from)
			out.WriteByte('-')
			out.WriteByte(to)
		}
		out.WriteByte(']')
	}
	moreDigits := func(minDigits, maxDigits int) {
		out.WriteString("[0-9]")
		if minDigits == maxDigits && minDigits == 1 {
			return
		}
		out.WriteString("{" + strconv.Itoa(minDigits))
		if maxDigits != minDigits {
			out.WriteByte(',')
			if maxDigits != math.MaxInt32 {
				out.WriteString(strconv.Itoa(maxDigits))
			}
		}
		out.WriteByte('}')
	}
	var uniformRange func(from, to string)
	uniformRange = func(from, to string) {
		i := 0
		for i < len(from) && i < len(to) && from[i] == to[i] {
			i++
		}
		if i > 0 {
			out.WriteString(`"` + from[:i] + `"`)
		}
		if i < len(from) && i < len(to) {
			if i > 0 {
				out.WriteByte(' ')
			}
			subLen := len(from) - i - 1
			if subLen > 0 {
				fromSub, toSub := from[i+1:], to[i+1:]
				subZeros, subNines := strings.Repeat("0", subLen), strings.Repeat("9", subLen)
				toReached := false
				out.WriteByte('(')
				if fromSub == subZeros {
					digitRange(from[i], to[i]-1)
					out.WriteByte(' ')
					moreDigits(subLen, subLen)
				} else {
					out.WriteString("[" + from[i:i+1] + "] (")
					uniformRange(fromSub, subNines)
					out.WriteByte(')')
					if from[i] < to[i]-1 {
						out.WriteString(" | ")
						if toSub == subNines {
							digitRange(from[i]+1, to[i])
							toReached = true
						} else {
							digitRange(from[i]+1, to[i]-1)
						}
						out.WriteByte(' ')
						moreDigits(subLen, subLen)
					}
				}
				if !toReached {
					out.WriteString(" | ")
					digitRange(to[i], to[i])
					out.WriteByte(' ')
					uniformRange(subZeros, toSub)
				}
				out.WriteByte(')')
			} else {
				out.WriteString("[" + from[i:i+1] + "-" + to[i:i+1] + "]")
			}
		}
	}

	if hasMin && hasMax {
		if lo < 0 && hi < 0 {
			out.WriteString(`"-" (`)
			minMaxInt(-hi, -lo, out, decimalsLeft, true)
			out.WriteByte(')')
			return
		}
		if lo < 0 {
			out.WriteString(`"-" (`)
			minMaxInt(0, -lo, out, decimalsLeft, true)
			out.WriteString(") | ")
			lo = 0
		}
		minS, maxS := strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)
		for digits := len(minS); digits < len(maxS); digits++ {
			uniformRange(minS, strings.Repeat("9", digits))
			minS = "1" + strings.Repeat("0", digits)
			out.WriteString(" | ")
		}
		uniformRange(minS, maxS)
		return
	}
	lessDecimals := max(decimalsLeft-1, 1)
	if hasMin {
		switch {
		case lo < 0:
			out.WriteString(`"-" (`)
			minMaxInt(minInt64, -lo, out, decimalsLeft, false)
			out.WriteString(") | [0] | [1-9] ")
			moreDigits(0, decimalsLeft-1)
		case lo == 0:
			if topLevel {
				out.WriteString("[0] | [1-9] ")
				moreDigits(0, lessDecimals)
			} else {
				moreDigits(1, decimalsLeft)
			}
		case lo <= 9:
			c := byte('0' + lo)
			rangeStart := byte('0')
			if topLevel {
				rangeStart = '1'
			}
			if c > rangeStart {
				digitRange(rangeStart, c-1)
				out.WriteByte(' ')
				moreDigits(1, lessDecimals)
				out.WriteString(" | ")
			}
			digitRange(c, '9')
			out.WriteByte(' ')
			moreDigits(0, lessDecimals)
		default:
			minS := strconv.FormatInt(lo, 10)
			c := minS[0]
			if c > '1' {
				rangeStart := byte('0')
				if topLevel {
					rangeStart = '1'
				}
				digitRange(rangeStart, c-1)
				out.WriteByte(' ')
				moreDigits(len(minS), lessDecimals)
				out.WriteString(" | ")
			}
			digitRange(c, c)
			out.WriteString(" (")
			rest, _ := strconv.ParseInt(minS[1:], 10, 64)
			minMaxInt(rest, maxInt64, out, lessDecimals, false)
			out.WriteByte(')')
			if c < '9' {
				out.WriteString(" | ")
				digitRange(c+1, '9')
				out.WriteByte(' ')
				moreDigits(len(minS)-1, lessDecimals)
			}
		}
		return
	}
	if hasMax {
		if hi >= 0 {
			if topLevel {
				out.WriteString(`"-" [1-9] `)
				moreDigits(0, lessDecimals)
				out.WriteString(" | ")
			}
			minMaxInt(0, hi, out, decimalsLeft, true)
		} else {
			out.WriteString(`"-" (`)
			minMaxInt(-hi, maxInt64, out, decimalsLeft, false)
			out.WriteByte(')')
		}
	}
}
