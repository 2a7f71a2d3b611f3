package controllerserver

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/apibudget"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/podrunner"
)

// apiRequests is every request the clients have seen since the first `from`
// actions of each, as "verb resource" (sorted), leaving out watches (the
// informers', shared by every volume).
func apiRequests(from []int, clients ...interface{ Actions() []k8stesting.Action }) []string {
	var out []string
	for i, c := range clients {
		for _, a := range c.Actions()[from[i]:] {
			if a.GetVerb() == "watch" {
				continue
			}
			r := a.GetResource().Resource
			if a.GetSubresource() != "" {
				r += "/" + a.GetSubresource()
			}
			out = append(out, a.GetVerb()+" "+r)
		}
	}
	sort.Strings(out)
	return out
}

func actionCounts(clients ...interface{ Actions() []k8stesting.Action }) []int {
	var n []int
	for _, c := range clients {
		n = append(n, len(c.Actions()))
	}
	return n
}

// BenchmarkAPIRequestsPerVolume is the controller side of pav's API budget
// (internal/apibudget): the requests of one CreateVolume (validation and
// creation pods) and one DeleteVolume (deletion pod) with the real pod runner
// on a fake API, reported per operation; above the budget it fails.
//
//	go test ./controllerserver -run '^$' -bench APIRequests
func BenchmarkAPIRequestsPerVolume(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pvc, sc := claimObjects()
	client := fake.NewClientset(pvc, sc)
	kubelet := fakekubelet.New(client, func(pod *corev1.Pod) fakekubelet.Outcome {
		o := fakekubelet.Outcome{Kind: fakekubelet.Succeed}
		if pod.Labels[podrunner.LabelPhase] == string(v1alpha1.PhaseCreation) {
			o.Files = map[string]string{"capacity": "1Mi"}
		}
		return o
	}, fakekubelet.Options{})
	if err := kubelet.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); kubelet.Wait() }()
	spec := strings.Replace(claimSpec, "  volumeValidation: {accessModes: [ReadWriteOncePod]}\n",
		"  volumeValidation: {accessModes: [ReadWriteOncePod], podTemplate: {spec: {containers: [{name: v, image: busybox}]}}}\n", 1)
	p := prov(b, spec)
	r := podrunner.New(podrunner.Config{Client: kubetest.Wrap(client), Provisioner: p.Name, ReportImage: "pav:test"})
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	c := &cluster{t: b, records: recordstest.NewClient(), client: client}
	s := c.server(p, r)

	var creates, deletes int
	b.ResetTimer()
	for range b.N {
		from := actionCounts(client, c.records)
		resp, err := s.CreateVolume(ctx, claimReq(pvc))
		if err != nil {
			b.Fatal(err)
		}
		created := apiRequests(from, client, c.records)
		from = actionCounts(client, c.records)
		if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.Volume.VolumeId}); err != nil {
			b.Fatal(err)
		}
		deleted := apiRequests(from, client, c.records)
		creates += len(created)
		deletes += len(deleted)
		if len(created) > apibudget.Create || len(deleted) > apibudget.Delete {
			b.Fatalf("CreateVolume made %d requests %v (budget %d), DeleteVolume %d %v (budget %d)",
				len(created), created, apibudget.Create, len(deleted), deleted, apibudget.Delete)
		}
		if b.N == 1 {
			b.Logf("CreateVolume: %d requests %v; DeleteVolume: %d %v", len(created), created, len(deleted), deleted)
		}
	}
	b.ReportMetric(float64(creates)/float64(b.N), "create-requests/op")
	b.ReportMetric(float64(deletes)/float64(b.N), "delete-requests/op")
}
