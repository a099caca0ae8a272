package etcdproc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// Certs are files of a throw-away certificate authority, made for one test
// run: a server certificate for 127.0.0.1 and client certificates by name.
type Certs struct {
	CAFile string
	Server transport.TLSInfo // for Config.ClientTLS, with client certificates required
	// Clients maps a client name (its certificate's common name, which
	// etcd also takes as the user name) to its TLSInfo.
	Clients map[string]transport.TLSInfo
}

// GenerateCerts writes a CA, a server certificate and one client
// certificate per name into dir.
func GenerateCerts(dir string, clients ...string) (*Certs, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "leasefence test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	c := &Certs{CAFile: filepath.Join(dir, "ca.pem"), Clients: map[string]transport.TLSInfo{}}
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (transport.TLSInfo, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return transport.TLSInfo{}, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return transport.TLSInfo{}, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return transport.TLSInfo{}, err
		}
		info := transport.TLSInfo{
			CertFile:      filepath.Join(dir, fmt.Sprintf("%s.pem", name)),
			KeyFile:       filepath.Join(dir, fmt.Sprintf("%s-key.pem", name)),
			TrustedCAFile: c.CAFile,
		}
		if err := writePEM(info.CertFile, "CERTIFICATE", der); err != nil {
			return transport.TLSInfo{}, err
		}
		return info, writePEM(info.KeyFile, "EC PRIVATE KEY", keyDER)
	}
	if c.Server, err = issue("server", 2, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	c.Server.ClientCertAuth = true
	for i, name := range clients {
		info, err := issue(name, int64(3+i), x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, err
		}
		c.Clients[name] = info
	}
	return c, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
