package mysql

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret:@/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseURL("mysql://app@db.example/shop?password_file=" + pw + "&timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "s3cret:@/x" || cfg.Addr != "db.example:3306" || cfg.DBName != "shop" ||
		cfg.Timeout != 5*time.Second || !cfg.ParseTime || cfg.Loc != time.UTC || !cfg.InterpolateParams || cfg.TLS != nil {
		t.Fatalf("config %+v", cfg)
	}
	if _, ok := cfg.Params["password_file"]; ok {
		t.Fatal("password_file reached the driver's session variables")
	}
	cfg, err = ParseURL("mysql://u:p%40ss@127.0.0.1:3307/d?interpolateParams=false")
	if err != nil || cfg.Passwd != "p@ss" || cfg.Addr != "127.0.0.1:3307" || cfg.InterpolateParams {
		t.Fatalf("config %+v, %v", cfg, err)
	}
	if cfg, err := ParseURL("u:p@tcp(h:1)/d"); err != nil || cfg.DBName != "d" || !cfg.InterpolateParams || !cfg.ParseTime {
		t.Fatalf("driver DSN: %+v, %v", cfg, err)
	}
	for _, tc := range []struct{ url, want string }{
		{"mysql://u:p@h/", "names no database"},
		{"mysql://u:p@h/d?tls_cert=/x", "tls_cert and tls_key go together"},
		{"mysql://u:p@h/d?tls_ca=" + filepath.Join(dir, "none"), "tls_ca"},
		{"mysql://u:p@h/d?tls_ca=" + pw, "holds no PEM certificate"},
		{"mysql://u:hunter2@h:port/d", "does not parse"},
		{"mysql://u:p@h/d?password_file=", "password_file must be given once"},
	} {
		_, err := ParseURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %v, want an error with %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL(%q) printed the password: %v", tc.url, err)
		}
	}
}

// FuzzParseURL: any URL gives a configuration or an error, never a panic,
// and an error never repeats the URL's password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"mysql://u:pw@h:3306/d?tls=true", "mysql://u:pw@h/d?password_file=/nonexistent", "u:pw@tcp(h)/d", "mysql://%zz", "mysql://u:pw@[::1]:1/d?x=%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		_, err := ParseURL(raw)
		if err != nil && strings.Contains(raw, "mysql://u:pw@") && strings.Contains(err.Error(), "pw@") {
			t.Fatalf("error repeats the password: %v", err)
		}
	})
}
