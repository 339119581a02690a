package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throwaway certificate authority of one test, made with
// crypto/x509: it signs server certificates for 127.0.0.1 and localhost and
// client certificates, and writes every certificate and key as a PEM file
// in a directory of the test (readable by the server users: mode 0644).
type PKI struct {
	t   testing.TB
	dir string
	ca  *x509.Certificate
	key *ecdsa.PrivateKey
	// CAFile is the PEM file of the CA certificate.
	CAFile string
	// CAPEM is the CA certificate in PEM.
	CAPEM []byte
}

// Cert is a certificate issued by a PKI.
type Cert struct {
	CertFile, KeyFile string          // PEM files
	CertPEM, KeyPEM   []byte          // the same in memory
	TLS               tls.Certificate // for a tls.Config
}

// NewPKI makes a new CA named name whose files live in a new directory of
// the test.
func NewPKI(t testing.TB, name string) *PKI {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testenv: CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{t: t, dir: dir, ca: ca, key: key}
	p.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p.CAFile = p.write(name+"-ca.pem", p.CAPEM)
	return p
}

// Pool returns a pool holding the CA certificate.
func (p *PKI) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return pool
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost.
func (p *PKI) Server(name string) Cert {
	return p.issue(name, x509.ExtKeyUsageServerAuth, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
}

// Client issues a client certificate whose common name is cn (a database
// user name, for PostgreSQL's cert authentication).
func (p *PKI) Client(cn string) Cert {
	return p.issue(cn, x509.ExtKeyUsageClientAuth, nil, nil)
}

// ServerTLS returns a server tls.Config with a certificate of this CA; with
// requireClientCert, clients must present a certificate this CA signed.
func (p *PKI) ServerTLS(requireClientCert bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.Server("server").TLS}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = p.Pool()
	}
	return cfg
}

func (p *PKI) issue(cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) Cert {
	t := p.t
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatalf("testenv: certificate %s: %v", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	c.CertFile = p.write(cn+"-cert.pem", c.CertPEM)
	c.KeyFile = p.write(cn+"-key.pem", c.KeyPEM)
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *PKI) write(name string, b []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
