package manager

// The csi-snapshot-metadata sidecar serves backup applications over TLS, and
// they find the CA that vouches for it in the SnapshotMetadataService object
// (spec.caCert). The manager makes both itself, for each provisioner with
// spec.snapshotMetadata, in a Secret of pav's namespace: a CA (ECDSA P-256,
// 10 years) and a serving certificate it signs for the sidecar's Service names
// (1 year), re-issued 90 days before it expires, or as soon as it does not
// match (another Service name, a broken key, another CA); the CA is replaced a
// year before its own end. A renewed serving certificate keeps the CA, so that
// clients, which read spec.caCert when they connect, never see the change; the
// sidecar reloads its files when the kubelet updates the mounted Secret. No
// cert-manager: a cluster need not run one for pav, and nothing but these two
// parties ever uses these certificates.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// The Secret's keys: the sidecar mounts only tls.crt and tls.key.
const (
	keyCert   = "tls.crt"
	keyKey    = "tls.key"
	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
)

const (
	caValidity         = 10 * 365 * 24 * time.Hour
	caRenewBefore      = 365 * 24 * time.Hour
	servingValidity    = 365 * 24 * time.Hour
	servingRenewBefore = 90 * 24 * time.Hour
	// backdate: certificates start a little in the past, for clocks a
	// little behind.
	backdate = 5 * time.Minute
)

// certificates returns the Secret data to keep: existing's when it still
// holds a valid CA and a valid serving certificate for dnsNames, else what
// is renewed of it; and when it must be renewed next.
func certificates(existing map[string][]byte, commonName string, dnsNames []string, now time.Time) (data map[string][]byte, renewAt time.Time, err error) {
	ca, caKey, caOK := parseCA(existing, now)
	if !caOK {
		if ca, caKey, err = newCA(commonName+" CA", now); err != nil {
			return nil, time.Time{}, err
		}
	}
	data = map[string][]byte{}
	if caOK {
		// Byte for byte what was there: nothing to write.
		data[keyCACert], data[keyCAKey] = existing[keyCACert], existing[keyCAKey]
	} else {
		data[keyCACert] = pemCert(ca.Raw)
		if data[keyCAKey], err = pemKey(caKey); err != nil {
			return nil, time.Time{}, err
		}
	}
	cert, certOK := parseServing(existing, ca, dnsNames, now)
	if caOK && certOK {
		data[keyCert], data[keyKey] = existing[keyCert], existing[keyKey]
	} else {
		certDER, key, err := issue(ca, caKey, commonName, dnsNames, now)
		if err != nil {
			return nil, time.Time{}, err
		}
		if cert, err = x509.ParseCertificate(certDER); err != nil {
			return nil, time.Time{}, err
		}
		data[keyCert] = pemCert(certDER)
		if data[keyKey], err = pemKey(key); err != nil {
			return nil, time.Time{}, err
		}
	}
	renewAt = ca.NotAfter.Add(-caRenewBefore)
	if r := cert.NotAfter.Add(-servingRenewBefore); r.Before(renewAt) {
		renewAt = r
	}
	return data, renewAt, nil
}

// parseCA reads the CA of data, if it is one and not due for renewal.
func parseCA(data map[string][]byte, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, bool) {
	cert, key, err := parsePair(data[keyCACert], data[keyCAKey])
	if err != nil || !cert.IsCA || now.Before(cert.NotBefore) || !now.Before(cert.NotAfter.Add(-caRenewBefore)) {
		return nil, nil, false
	}
	return cert, key, true
}

// parseServing reads the serving certificate of data, if ca signed it for
// exactly dnsNames, its key matches, and it is not due for renewal.
func parseServing(data map[string][]byte, ca *x509.Certificate, dnsNames []string, now time.Time) (*x509.Certificate, bool) {
	cert, _, err := parsePair(data[keyCert], data[keyKey])
	if err != nil || ca == nil || cert.CheckSignatureFrom(ca) != nil || !slices.Equal(cert.DNSNames, dnsNames) ||
		now.Before(cert.NotBefore) || !now.Before(cert.NotAfter.Add(-servingRenewBefore)) {
		return nil, false
	}
	return cert, true
}

// parsePair reads a PEM certificate and its PEM ECDSA key (PKCS #8), and
// checks that they belong together.
func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil || cb.Type != "CERTIFICATE" || kb.Type != "PRIVATE KEY" {
		return nil, nil, errors.New("not a PEM certificate and key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("not an ECDSA key")
	}
	if pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return nil, nil, errors.New("the key is not the certificate's")
	}
	return cert, key, nil
}

func newCA(commonName string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("making the snapshot metadata CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, commonName string, dnsNames []string, now time.Time) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(servingValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("making the snapshot metadata serving certificate: %w", err)
	}
	return der, key, nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// sameData: two Secrets' data are equal.
func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
