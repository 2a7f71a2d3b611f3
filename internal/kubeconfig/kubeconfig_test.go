package kubeconfig

import (
	"os"
	"path/filepath"
	"testing"
)

// Every client built from the config shares one token bucket: the rate is
// the process's, not each client's.
func TestLoadSharesOneRateLimiter(t *testing.T) {
	cfg, err := Load(writeKubeconfig(t, "http://127.0.0.1:1"), Rate{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RateLimiter == nil || cfg.RateLimiter.QPS() != float32(DefaultRate.QPS) || cfg.Burst != DefaultRate.Burst {
		t.Fatalf("rate limiter %v, burst %d; want one bucket at %v/%d", cfg.RateLimiter, cfg.Burst, DefaultRate.QPS, DefaultRate.Burst)
	}
	if err := (Rate{QPS: 0, Burst: 1}).Validate(); err == nil {
		t.Error("a zero QPS passed")
	}
}

// writeKubeconfig writes a kubeconfig of one server, without credentials.
func writeKubeconfig(t *testing.T, server string) string {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: '"+server+"'}}]\n"+
		"users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}
