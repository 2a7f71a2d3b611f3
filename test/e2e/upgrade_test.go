//go:build e2e

package e2e

// The upgrade from the last release (issue 26, item 1): make e2e-upgrade.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	upgradeProvisioner = "pav-upgrade"
	// upgradeRoot is pav-upgrade's backend and record of its pods' runs
	// (test/e2e/upgrade/provisioner.yaml).
	upgradeRoot = "/srv/pav-upgrade"
)

// lastRelease reads test/e2e/upgrade/last-release: the release's tag and commit.
func lastRelease(t *testing.T) (tag, commit string) {
	t.Helper()
	f, err := os.Open(filepath.Join(repo, "test", "e2e", "upgrade", "last-release"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok {
			switch k {
			case "LAST_RELEASE":
				tag = v
			case "LAST_RELEASE_COMMIT":
				commit = v
			}
		}
	}
	if tag == "" || commit == "" {
		t.Fatalf("test/e2e/upgrade/last-release names no LAST_RELEASE and LAST_RELEASE_COMMIT")
	}
	return tag, commit
}

// upgradeVolume is one volume the last release created, and its client.
type upgradeVolume struct {
	claim, client string
	block, live   bool
	pv            *corev1.PersistentVolume
	handle        string
	lastTick      int
}

// upgradeRuns counts how many times a phase's pod of pav-upgrade ran for a handle.
func upgradeRuns(phase, handle string) int {
	b, err := os.ReadFile(filepath.Join(upgradeRoot, "runs", phase, handle))
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// fsClient writes a file of its own before the upgrade, then rewrites a tick file
// and reads both back twice a second, forever: the first I/O error (a lost
// staging, a FUSE daemon gone) ends it, Failed, with IOERROR in its log.
const fsClient = `set -u
d=/data/%s
echo before-upgrade > $d/pre || { echo "IOERROR writing pre"; exit 1; }
i=0
while :; do
  i=$((i+1))
  echo "$i" > $d/tick || { echo "IOERROR writing tick $i"; exit 1; }
  got=$(cat $d/tick) || { echo "IOERROR reading tick $i"; exit 1; }
  [ "$got" = "$i" ] || { echo "IOERROR read tick $got, wrote $i"; exit 1; }
  [ "$(cat $d/pre)" = before-upgrade ] || { echo "IOERROR pre lost at tick $i"; exit 1; }
  [ $((i %% 4)) -ne 0 ] || echo "tick $i"
  sleep 0.5
done
`

// blockClient is fsClient on a block device: sector 0 written once, sector 1 each
// tick (fsync), both read back; it also says the device's size.
const blockClient = `set -u
b=/dev/%s
printf '%%-511s\n' before-upgrade | dd of=$b bs=512 count=1 conv=notrunc,fsync 2>/dev/null || { echo "IOERROR writing pre"; exit 1; }
i=0
while :; do
  i=$((i+1))
  printf '%%-511s\n' "$i" | dd of=$b bs=512 seek=1 count=1 conv=notrunc,fsync 2>/dev/null || { echo "IOERROR writing tick $i"; exit 1; }
  got=$(dd if=$b bs=512 skip=1 count=1 2>/dev/null | tr -d ' \n') || { echo "IOERROR reading tick $i"; exit 1; }
  [ "$got" = "$i" ] || { echo "IOERROR read tick $got, wrote $i"; exit 1; }
  [ "$(dd if=$b bs=512 count=1 2>/dev/null | tr -d ' \n')" = before-upgrade ] || { echo "IOERROR pre lost at tick $i"; exit 1; }
  [ $((i %% 4)) -ne 0 ] || echo "tick $i size $(blockdev --getsize64 $b)"
  sleep 0.5
done
`

var tickLine = regexp.MustCompile(`(?m)^tick (\d+)(?: size (\d+))?$`)

// clientState is the last tick of a client's log (and, for a block device, its size);
// an IOERROR, or a client that is not running any more, fails the test.
func (e *env) clientState(v *upgradeVolume) (tick int, size int64) {
	e.t.Helper()
	p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, v.client, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	log := e.logs(v.client)
	if strings.Contains(log, "IOERROR") || p.Status.Phase != corev1.PodRunning {
		e.t.Fatalf("client %s of %s (pod %s) saw an I/O error or ended:\n%s", v.client, v.claim, p.Status.Phase, log)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.RestartCount > 0 {
			e.t.Fatalf("client %s restarted", v.client)
		}
	}
	for _, m := range tickLine.FindAllStringSubmatch(log, -1) {
		tick, _ = strconv.Atoi(m[1])
		if m[2] != "" {
			size, _ = strconv.ParseInt(m[2], 10, 64)
		}
	}
	return tick, size
}

// waitTicks waits until every client has ticked past where it was, and checks that
// none saw an error.
func (e *env) waitTicks(vols []*upgradeVolume) {
	e.t.Helper()
	for _, v := range vols {
		e.poll("client "+v.client+" ticking past "+strconv.Itoa(v.lastTick), func() (bool, error) {
			tick, _ := e.clientState(v)
			if tick > v.lastTick {
				v.lastTick = tick
				return true, nil
			}
			return false, nil
		})
	}
}

// stateOf reads a volume's state.json on node 1, as JSON.
func stateOf(t *testing.T, handle string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nodeserver.VolumeDir(pluginVolumes(upgradeProvisioner), handle), "state.json"))
	if err != nil {
		t.Fatalf("state of volume %s on node 1: %v", handle, err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// stagingPodOf is the staging pod of a handle on node 1 (nil if none).
func stagingPodOf(t *testing.T, handle string) *corev1.Pod {
	t.Helper()
	pods := pavPods(upgradeProvisioner, string(v1alpha1.PhaseStaging), handle+"@")
	switch len(pods) {
	case 0:
		return nil
	case 1:
		return &pods[0]
	}
	t.Fatalf("%d staging pods of volume %s", len(pods), handle)
	return nil
}

// canI asks the API server whether a ServiceAccount of pav may do verb on resource.
func canI(t *testing.T, sa, verb, resource string) bool {
	t.Helper()
	r, err := client.AuthorizationV1().SubjectAccessReviews().Create(bgCtx(), &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:pav:" + sa,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:pav"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// waitDriversOn waits until the manager has rolled pav-upgrade's drivers onto image,
// and they are ready.
func waitDriversOn(t *testing.T, image string) {
	t.Helper()
	for _, r := range []string{"statefulset/pav-" + upgradeProvisioner + "-controller", "daemonset/pav-" + upgradeProvisioner + "-node"} {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			out, _ := kubectlErr("-n", "pav", "get", r, "-o", `jsonpath={.spec.template.spec.containers[?(@.name=="pav")].image}`)
			if strings.TrimSpace(out) == image {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still runs %q, want %s", r, out, image)
			}
			time.Sleep(time.Second)
		}
		kubectl(t, "-n", "pav", "rollout", "status", r, "--timeout=180s")
	}
	if err := waitProvisionerReady(bgCtx(), upgradeProvisioner, 3*time.Minute); err != nil {
		t.Fatalf("%s not ready on %s: %v", upgradeProvisioner, image, err)
	}
}

// TestUpgrade installs the last release (test/e2e/upgrade/last-release, built from its
// own tree by hack/upgrade-from.sh), makes a volume of each kind with it (a directory, a
// live FUSE mount whose staging pod keeps running, a Block device), each with a client
// that writes and reads twice a second, then upgrades pav to the working tree the way
// docs/install.md says (apply the new install; delete what the release left). Then:
// no client saw an I/O error, nothing was staged again, each volume has a PavVolume
// adopted from its PV and a state.json of the current format; the volumes grow,
// are snapshotted and restored through the phases the release lacked; new volumes
// work; and everything deletes cleanly, each phase once. It uninstalls the working
// tree's pav first and reinstalls it at the end, as make deploy-e2e does. make
// e2e-upgrade runs it (PAV_UPGRADE=1); plain go test skips it.
func TestUpgrade(t *testing.T) {
	if os.Getenv("PAV_UPGRADE") == "" {
		t.Skip("make e2e-upgrade runs it (PAV_UPGRADE=1): it uninstalls pav, installs the last release and upgrades it")
	}
	afterLanes(t) // it replaces pav under every other test
	release, commit := lastRelease(t)
	ctx := context.Background()
	begin := time.Now()
	step := time.Now()
	took := func(what string) {
		t.Logf("%s: %v", what, time.Since(step).Round(100*time.Millisecond))
		step = time.Now()
	}
	if pv := volumeHoldingUninstall(t, ctx); pv != "" {
		t.Fatalf("%s exists: uninstalling pav would (rightly) wait for it; run make e2e-upgrade on a cluster without other volumes", pv)
	}
	if err := os.RemoveAll(upgradeRoot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() { // else its record of pod runs tells what happened
			_ = os.RemoveAll(upgradeRoot)
		}
	})

	// The release's images, from its own tree.
	run(t, filepath.Join(repo, "hack", "upgrade-from.sh"), "--import")
	oldInstall := filepath.Join(repo, "_output", "upgrade", release, "install.yaml")
	took(fmt.Sprintf("%s (%.12s) built and imported", release, commit))

	// The working tree's pav goes (docs/install.md#uninstall), and comes back at the end
	// as make deploy-e2e installs it, whatever happened in between.
	t.Cleanup(func() {
		start := time.Now()
		_, _ = kubectlErr("delete", "pav", upgradeProvisioner, "--ignore-not-found", "--timeout=120s")
		examples, err := filepath.Glob(repo + "/examples/*/provisioner.yaml")
		if err != nil {
			t.Fatal(err)
		}
		run(t, repo+"/hack/install-local.sh", append([]string{repo + "/test/e2e/pav-e2e/provisioner.yaml"}, examples...)...)
		t.Logf("reinstalled the working tree's pav in %v", time.Since(start).Round(time.Second))
	})
	kubectl(t, "delete", "pav", "--all", "--timeout=120s")
	kubectl(t, "delete", "-k", repo+"/test/e2e/install", "--timeout=120s")
	took("the working tree's pav uninstalled")

	// The release, installed as its make install did, and pav-upgrade as it understood it.
	kubectl(t, "apply", "-f", oldInstall)
	kubectl(t, "wait", "--for", "condition=established", "--timeout=60s", "crd/pavprovisioners.pav.albertofaria.github.io")
	kubectl(t, "-n", "pav", "rollout", "status", "deployment/pav-manager", "--timeout=180s")
	kubectl(t, "apply", "-f", repo+"/test/e2e/upgrade/provisioner.yaml")
	waitDriversOn(t, "pav.local/pav:"+release)
	took(release + " installed, " + upgradeProvisioner + " Ready")

	e := newLongEnv(t, 40*time.Minute)
	class := func(kind string) string {
		sc := e.newSC(upgradeProvisioner, map[string]string{"kind": kind}, storagev1.VolumeBindingImmediate)
		sc.AllowVolumeExpansion = ptr(true)
		return e.createSC(sc)
	}
	vols := []*upgradeVolume{
		{claim: "dir", client: "client-dir"},
		{claim: "live", client: "client-live", live: true},
		{claim: "block", client: "client-block", block: true},
	}
	for _, v := range vols {
		o := claimOpts{size: "16Mi"}
		kind := v.claim
		if v.block {
			o = claimOpts{size: "8Mi", mode: corev1.PersistentVolumeBlock}
		}
		e.claim(v.claim, class(kind), o)
	}
	for _, v := range vols {
		v.pv = e.waitBound(v.claim)
		v.handle = v.pv.Spec.CSI.VolumeHandle
		script := fmt.Sprintf(fsClient, v.claim)
		if v.block {
			script = fmt.Sprintf(blockClient, v.claim)
		}
		e.clientPod(v.client, script, v.claim)
	}
	for _, v := range vols {
		e.waitPodRunning(v.client)
	}
	e.waitTicks(vols)
	// What the release made: PVs with its attributes (the claim snapshot), states of
	// its format (no version, the staging pod's namespace), one staging each.
	livePod := map[string]types.UID{}
	for _, v := range vols {
		if _, ok := v.pv.Spec.CSI.VolumeAttributes[v1alpha1.GroupName+"/claim"]; !ok {
			t.Fatalf("PV %s of %s has no claim attribute: %v", v.pv.Name, release, v.pv.Spec.CSI.VolumeAttributes)
		}
		st := stateOf(t, v.handle)
		if _, ok := st["formatVersion"]; ok || st["podNamespace"] == nil || st["staged"] != true {
			t.Fatalf("state of %s under %s: %v", v.claim, release, st)
		}
		if n := upgradeRuns("staging", v.handle); n != 1 {
			t.Fatalf("%s staged %d times under %s", v.claim, n, release)
		}
		if v.live {
			p := stagingPodOf(t, v.handle)
			if p == nil || p.Status.Phase != corev1.PodRunning {
				t.Fatalf("the live volume's staging pod is not running under %s: %+v", release, p)
			}
			livePod[v.handle] = p.UID
		}
	}
	took("three volumes of " + release + " in use")

	// The upgrade, as docs/install.md#upgrade says: apply the new install.
	upgradeStart := time.Now()
	kubectl(t, "apply", "-k", repo+"/test/e2e/install")
	kubectl(t, "wait", "--for", "condition=established", "--timeout=60s", "crd/pavprovisioners.pav.albertofaria.github.io",
		"crd/pavvolumes.pav.albertofaria.github.io", "crd/pavsnapshots.pav.albertofaria.github.io", "crd/pavgroupsnapshots.pav.albertofaria.github.io")
	kubectl(t, "-n", "pav", "rollout", "status", "deployment/pav-manager", "--timeout=180s")
	waitDriversOn(t, "pav.local/pav:dev")
	t.Logf("upgrade applied and rolled out in %v", time.Since(upgradeStart).Round(100*time.Millisecond))
	// v0.2.0's driver role is emptied by the new install: its leftover bindings grant
	// nothing even before they are deleted (the node plugins may no longer list PVs
	// or patch claims).
	for _, c := range []struct{ sa, verb, resource string }{
		{"pav-node", "list", "persistentvolumes"}, {"pav-node", "patch", "persistentvolumeclaims"},
		{"pav-controller", "patch", "persistentvolumeclaims"},
	} {
		if canI(t, c.sa, c.verb, c.resource) {
			t.Errorf("after the upgrade, %s may still %s %s", c.sa, c.verb, c.resource)
		}
	}
	// ... and the docs' clean-up step.
	kubectl(t, "delete", "clusterrolebinding", "pav-controller-driver", "pav-node-driver", "--ignore-not-found")
	took("upgraded to the working tree")

	// Nothing was lost or staged again, and what the release wrote was taken over.
	e.waitTicks(vols)
	for _, v := range vols {
		if n := upgradeRuns("staging", v.handle); n != 1 {
			t.Errorf("%s was staged %d times: the upgrade staged it again", v.claim, n)
		}
		rec, err := record(ctx, v.pv.Name)
		if err != nil || rec == nil {
			t.Fatalf("no PavVolume for %s (PV %s): %v", v.claim, v.pv.Name, err)
		}
		if rec.Spec.Adopted == nil || rec.Spec.Adopted.PersistentVolume != v.pv.Name || rec.Spec.Adopted.Release != release ||
			rec.Status.Handle != v.handle || rec.Status.Phase != v1alpha1.VolumeCreated || rec.Spec.FormatVersion != 1 || rec.Spec.PVC == nil {
			t.Errorf("PavVolume of %s: spec %+v status %+v", v.claim, rec.Spec, rec.Status)
		}
		st := stateOf(t, v.handle)
		if st["formatVersion"] != float64(1) || st["podNamespace"] != nil || st["bootID"] == nil {
			t.Errorf("state of %s after the upgrade: %v", v.claim, st)
		}
		if v.live {
			p := stagingPodOf(t, v.handle)
			if p == nil || p.UID != livePod[v.handle] || p.Status.Phase != corev1.PodRunning {
				t.Fatalf("the live volume's staging pod did not survive the upgrade: %+v", p)
			}
			if sp, _ := st["stagingPod"].(map[string]any); sp == nil || sp["uid"] != string(p.UID) || st["keepRunning"] != true {
				t.Errorf("the live volume's state does not watch its staging pod: %v", st)
			}
		}
	}
	evs, err := client.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Reason == "VolumeRestaged" || ev.Reason == "VolumeStagingLost" {
			t.Errorf("event %s on %s: %s", ev.Reason, ev.InvolvedObject.Name, ev.Message)
		}
	}
	took("clients unharmed, nothing staged again, records adopted")

	// The phases the release lacked, added as an administrator would.
	kubectl(t, "patch", "pav", upgradeProvisioner, "--type", "merge", "--patch-file", repo+"/test/e2e/upgrade/phases.yaml")
	e.poll("the drivers of "+upgradeProvisioner+" with csi-resizer and csi-snapshotter", func() (bool, error) {
		pods, err := client.CoreV1().Pods("pav").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + upgradeProvisioner})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if strings.Contains(p.Name, "-controller-") {
				names := ""
				for _, c := range p.Spec.Containers {
					names += c.Name + " "
				}
				if strings.Contains(names, "resizer") && strings.Contains(names, "snapshotter") && podReady(&p) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err := waitProvisionerReady(ctx, upgradeProvisioner, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	byClaim := map[string]*upgradeVolume{}
	for _, v := range vols {
		byClaim[v.claim] = v
	}
	// The Block volume grows online, its client running.
	blk := byClaim["block"]
	if _, err := client.CoreV1().PersistentVolumeClaims(e.ns).Patch(ctx, "block", types.MergePatchType,
		[]byte(`{"spec":{"resources":{"requests":{"storage":"16Mi"}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("claim block grown to 16Mi", func() (bool, error) {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "block", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := pvc.Status.Capacity[corev1.ResourceStorage]
		return q.Cmp(resource.MustParse("16Mi")) == 0, nil
	})
	e.poll("client-block seeing 16Mi", func() (bool, error) {
		_, size := e.clientState(blk)
		return size == 16<<20, nil
	})
	if fi, err := os.Stat(filepath.Join(upgradeRoot, "backend", blk.handle+".img")); err != nil || fi.Size() != 16<<20 {
		t.Fatalf("backend file of the grown volume: %v %v", fi, err)
	}
	took("the Block volume of " + release + " grown online")

	// Snapshots of old volumes, restored into new ones.
	vsc := e.snapshotClass(upgradeProvisioner)
	snaps := map[string]readySnapshot{}
	for _, claim := range []string{"dir", "block"} {
		e.volumeSnapshot("snap-"+claim, vsc, claim)
	}
	for _, claim := range []string{"dir", "block"} {
		snaps[claim] = e.waitSnapshotReady("snap-" + claim)
	}
	e.sourcedClaim("dir-restored", class("dir"), claimOpts{size: "16Mi"}, snapshotSource("snap-dir"))
	e.sourcedClaim("block-restored", class("block"), claimOpts{size: "16Mi", mode: corev1.PersistentVolumeBlock}, snapshotSource("snap-block"))
	e.claim("live-new", class("live"), claimOpts{size: "16Mi"})
	var newPVs []*corev1.PersistentVolume
	for _, c := range []string{"dir-restored", "block-restored", "live-new"} {
		newPVs = append(newPVs, e.waitBound(c))
	}
	if got := e.runClient("read-dir-restored", "cat /data/dir-restored/pre", "dir-restored"); strings.TrimSpace(got) != "before-upgrade" {
		t.Errorf("restored directory reads %q", got)
	}
	if got := e.runClient("read-block-restored", "dd if=/dev/block-restored bs=512 count=1 2>/dev/null | tr -d ' \\n'; echo; blockdev --getsize64 /dev/block-restored", "block-restored"); got != "before-upgrade\n16777216\n" {
		t.Errorf("restored Block volume reads %q", got)
	}
	if got := e.runClient("rw-live-new", "echo new > /data/live-new/f && cat /data/live-new/f", "live-new"); strings.TrimSpace(got) != "new" {
		t.Errorf("a new live volume reads %q", got)
	}
	took("old volumes snapshotted and restored; new volumes work")
	e.waitTicks(vols)

	// Everything goes, each phase once, nothing left.
	for _, v := range vols {
		e.deletePod(v.client)
	}
	for _, p := range []string{"read-dir-restored", "read-block-restored", "rw-live-new"} {
		e.deletePod(p)
	}
	for _, v := range vols {
		e.waitUnstaged(upgradeProvisioner, v.handle)
		if n := upgradeRuns("unstaging", v.handle); n != 1 {
			t.Errorf("%s unstaged %d times", v.claim, n)
		}
	}
	for _, claim := range []string{"dir", "block"} {
		e.deleteSnapshot("snap-"+claim, snaps[claim].content)
	}
	claims := []string{"dir", "live", "block", "dir-restored", "block-restored", "live-new"}
	for _, c := range claims {
		e.deleteClaim(c)
	}
	handles := map[string]string{}
	for _, v := range vols {
		handles[v.pv.Name] = v.handle
	}
	for _, pv := range newPVs {
		handles[pv.Name] = pv.Spec.CSI.VolumeHandle
	}
	for name, handle := range handles {
		e.waitPVGone(name)
		if n := upgradeRuns("deletion", handle); n != 1 {
			t.Errorf("volume %s (%s) deleted %d times", name, handle, n)
		}
		if _, err := os.Stat(filepath.Join(upgradeRoot, "backend", handle)); !os.IsNotExist(err) {
			t.Errorf("the backend of %s is left: %v", handle, err)
		}
		if _, err := os.Stat(filepath.Join(upgradeRoot, "backend", handle+".img")); !os.IsNotExist(err) {
			t.Errorf("the backend file of %s is left: %v", handle, err)
		}
		if rec, err := record(ctx, name); err != nil || rec != nil {
			t.Errorf("PavVolume %s left: %v %v", name, rec, err)
		}
	}
	if left, err := pavSnapshotRecords(ctx, nil, []string{handles[byClaim["dir"].pv.Name], blk.handle}); err != nil || len(left) > 0 {
		t.Errorf("PavSnapshots left: %v %v", left, err)
	}
	if left, _ := os.ReadDir(pluginVolumes(upgradeProvisioner)); len(left) > 0 {
		t.Errorf("%d volume directories left on node 1", len(left))
	}
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + upgradeProvisioner})
	for _, p := range pods.Items {
		t.Errorf("pod %s/%s (%s) left", p.Namespace, p.Name, p.Labels[podrunner.LabelPhase])
	}
	if err := client.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	kubectl(t, "delete", "pav", upgradeProvisioner, "--timeout=120s")
	took("everything deleted")
	t.Logf("the upgrade test took %v", time.Since(begin).Round(time.Second))
}
