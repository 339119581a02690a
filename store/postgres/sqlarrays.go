package postgres

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// textArrays returns the statement arguments of a Writer with every array
// written as a PostgreSQL array literal ('{…}'), so that WriteSQL works
// with any database/sql driver (lib/pq, pgx's stdlib, …): the statement
// casts each parameter ($1::uuid[], …), and every driver can send text.
func textArrays(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case [][16]byte:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) { b.WriteString(uuid.Format(v[j])) })
		case []int64:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) { b.WriteString(strconv.FormatInt(v[j], 10)) })
		case []string:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) { quoteElem(b, v[j]) })
		case []*string:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) {
				if v[j] == nil {
					b.WriteString("NULL")
					return
				}
				quoteElem(b, *v[j])
			})
		case [][]byte:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) { quoteElem(b, `\x`+hex.EncodeToString(v[j])) })
		case []time.Time:
			out[i] = arrayLiteral(len(v), func(b *strings.Builder, j int) {
				// Microseconds, as PostgreSQL stores them (and pgx sends).
				quoteElem(b, v[j].UTC().Truncate(time.Microsecond).Format("2006-01-02 15:04:05.999999Z07:00"))
			})
		default:
			out[i] = a
		}
	}
	return out
}

func arrayLiteral(n int, elem func(b *strings.Builder, i int)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		elem(&b, i)
	}
	b.WriteByte('}')
	return b.String()
}

// quoteElem writes s as a double-quoted array element, escaping '"' and
// '\' with a backslash.
func quoteElem(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}
