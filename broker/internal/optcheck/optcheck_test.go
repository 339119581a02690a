package optcheck

import (
	"errors"
	"net/url"
	"testing"
	"time"
)

func TestFieldsKeepsTheFirstFailure(t *testing.T) {
	inner := errors.New("inner")
	c := Check("kafka")
	c.Between("Channels", 3, 1, 8)
	c.AtLeast("DialTimeout", time.Second, time.Millisecond)
	if err := c.Err(); err != nil {
		t.Fatalf("valid fields: %v", err)
	}
	c.Between("MaxInFlight", 0, 1, 100)
	c.AtLeast("DialTimeout", 0, time.Millisecond)
	if err, want := c.Err(), "kafka: MaxInFlight must be between 1 and 100, got 0"; err == nil || err.Error() != want {
		t.Errorf("Err = %v; want %q", err, want)
	}

	c = Check("rabbitmq")
	c.AtLeast("Heartbeat", 0, time.Second)
	if err, want := c.Err(), "rabbitmq: Heartbeat must be at least 1s, got 0s"; err == nil || err.Error() != want {
		t.Errorf("Err = %v; want %q", err, want)
	}
	c = Check("natsjs")
	c.Failf(true, "SubjectPrefix is wrong: %w", inner)
	if err := c.Err(); !errors.Is(err, inner) || err.Error() != "natsjs: SubjectPrefix is wrong: inner" {
		t.Errorf("Failf: %v, want it to wrap %v", err, inner)
	}
}

func TestName(t *testing.T) {
	for _, tc := range []struct {
		name, extra, want string
	}{
		{"orders.new", "._-", ""},
		{"", "._-", "must be 1 to 10 bytes, got 0"},
		{"abcdefghijk", "._-", "must be 1 to 10 bytes, got 11"},
		{"a b", "._-", `"a b" has ' ' at byte 1: use only letters, digits, '.', '_' and '-'`},
		{"a/b", "-_.:", `"a/b" has '/' at byte 1: use only letters, digits, '-', '_', '.' and ':'`},
		{"a b", "_", `"a b" has ' ' at byte 1: use only letters, digits, '_'`},
	} {
		err := Name(tc.name, 10, tc.extra)
		if got := ""; err != nil {
			got = err.Error()
			if got != tc.want {
				t.Errorf("Name(%q, %q) = %q; want %q", tc.name, tc.extra, got, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("Name(%q, %q) = nil; want %q", tc.name, tc.extra, tc.want)
		}
	}
}

func TestQuery(t *testing.T) {
	read := func(raw string) (map[string]any, error) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]any{}
		err = Query(q, "x: URL u", []string{"b", "n", "d", "pd", "s"}, []string{"driver"}, func(p Param) error {
			var v any
			var err error
			switch p.Name {
			case "b":
				v, err = p.Bool()
			case "n":
				v, err = p.PositiveInt()
			case "d":
				v, err = p.Duration()
			case "pd":
				v, err = p.PositiveDuration()
			default:
				v = p.Value
			}
			got[p.Name] = v
			return err
		})
		return got, err
	}
	got, err := read("b=true&n=3&d=0s&pd=1s&s=x&driver=1")
	if err != nil || got["b"] != true || got["n"] != 3 || got["d"] != time.Duration(0) || got["pd"] != time.Second || got["s"] != "x" || got["driver"] != nil {
		t.Errorf("Query = %v, %v", got, err)
	}
	for raw, want := range map[string]string{
		"bogus=1": `x: URL u: unknown query parameter "bogus"; accepted: b, n, d, pd, s, driver`,
		"s=a&s=b": `x: URL u: query parameter "s" is given 2 times; give it once`,
		"b=maybe": `x: URL u: query parameter b="maybe" must be true or false`,
		"n=0":     `x: URL u: query parameter n="0" must be a positive integer`,
		"d=-1s":   `x: URL u: query parameter d="-1s" must be a duration such as 10s`,
		"pd=0s":   `x: URL u: query parameter pd="0s" must be a positive duration such as 10s`,
	} {
		if _, err := read(raw); err == nil || err.Error() != want {
			t.Errorf("Query(%s) = %v; want %q", raw, err, want)
		}
	}
}
