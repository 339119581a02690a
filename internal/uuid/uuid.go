// Package uuid is the one codec of the canonical UUID text every message ID
// is written in: 36 characters, lower-case hex digits in groups of 8, 4, 4,
// 4 and 12 separated by '-' (what outbox.ValidateID accepts). It imports
// only the standard library, so that any package of the module, the root
// one included, can use it.
package uuid

import "encoding/hex"

// Format encodes u in the canonical lower-case form.
func Format(u [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return string(s[:])
}

// Parse decodes s, in the canonical lower-case form, in one pass. It
// reports false for anything else (upper-case digits included); the caller
// says why, with outbox.ValidateID.
func Parse(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	j := 0
	for i := 0; i < 36; i += 2 {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i-- // skip the dash: the next pair starts one further
			continue
		}
		hi, lo := hexVal[s[i]], hexVal[s[i+1]]
		if hi|lo > 0x0f {
			return u, false
		}
		u[j] = hi<<4 | lo
		j++
	}
	return u, true
}

// hexVal maps a lower-case hex digit to its value, anything else to 0xff.
var hexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
	}
	return t
}()
