// Command snapshot-metadata-client is the end-to-end suite's backup application
// (test/e2e/snapshotmetadata_test.go), test-only: it lists a snapshot's
// allocated blocks, or the blocks changed since an earlier snapshot, through a
// CSI driver's external-snapshot-metadata sidecar, exactly as a backup
// application does, with external-snapshot-metadata's own client library
// (pkg/iterator): the SnapshotMetadataService named after the driver gives the
// address, CA and audience; a token of the pod's ServiceAccount for that
// audience authenticates it; TLS with that CA.
//
// It prints one JSON object on stdout: the ranges it received and what every
// message said, after checking the stream against CSI's rules (one type and
// capacity throughout, at most -max-results ranges a message, offsets strictly
// increasing and ranges never overlapping, across messages too); or, with
// -verify-source and -verify-target, whether copying the changed ranges from
// the source device onto the target device made the two equal (upstream's
// VerifierEmitter, the check of its snapshot-metadata-verifier). An error is
// {"error": "...", "code": "InvalidArgument"} and exit code 1.
//
// A module of its own under hack/tools, so that pav's go.mod never carries
// external-snapshot-metadata and the clients it brings; hack/images/build.sh
// builds it into pav.local/snapshot-metadata-client:dev.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
)

// result is what stdout gets.
type result struct {
	Type     string     `json:"type,omitempty"`
	Capacity int64      `json:"capacity,omitempty"`
	Messages int        `json:"messages"`
	Ranges   [][2]int64 `json:"ranges"`
	Verified bool       `json:"verified,omitempty"`
	Error    string     `json:"error,omitempty"`
	Code     string     `json:"code,omitempty"`
}

// collector keeps what the stream sent and checks it against CSI's rules.
type collector struct {
	max int32
	res *result
	end int64 // the end of the last range
}

func (c *collector) SnapshotMetadataIteratorRecord(_ int, m iterator.IteratorMetadata) error {
	r := c.res
	r.Messages++
	if r.Messages == 1 {
		r.Type, r.Capacity = m.BlockMetadataType.String(), m.VolumeCapacityBytes
	} else if m.BlockMetadataType.String() != r.Type || m.VolumeCapacityBytes != r.Capacity {
		return fmt.Errorf("message %d: type %s and capacity %d, the first said %s and %d", r.Messages, m.BlockMetadataType, m.VolumeCapacityBytes, r.Type, r.Capacity)
	}
	if c.max > 0 && len(m.BlockMetadata) > int(c.max) {
		return fmt.Errorf("message %d holds %d ranges, more than max_results %d", r.Messages, len(m.BlockMetadata), c.max)
	}
	for _, b := range m.BlockMetadata {
		if b.SizeBytes <= 0 || b.ByteOffset < c.end || (len(r.Ranges) > 0 && b.ByteOffset <= r.Ranges[len(r.Ranges)-1][0]) {
			return fmt.Errorf("message %d: range %d+%d after one that ends at %d", r.Messages, b.ByteOffset, b.SizeBytes, c.end)
		}
		if r.Type == "FIXED_LENGTH" && len(r.Ranges) > 0 && b.SizeBytes != r.Ranges[0][1] {
			return fmt.Errorf("message %d: range %d+%d in a FIXED_LENGTH stream of %d", r.Messages, b.ByteOffset, b.SizeBytes, r.Ranges[0][1])
		}
		r.Ranges = append(r.Ranges, [2]int64{b.ByteOffset, b.SizeBytes})
		c.end = b.ByteOffset + b.SizeBytes
	}
	return nil
}

func (c *collector) SnapshotMetadataIteratorDone(int) error { return nil }

// both feeds the stream to the collector's checks and to the verifier.
type both struct {
	c *collector
	v *iterator.VerifierEmitter
}

func (b both) SnapshotMetadataIteratorRecord(n int, m iterator.IteratorMetadata) error {
	if err := b.c.SnapshotMetadataIteratorRecord(n, m); err != nil {
		return err
	}
	return b.v.SnapshotMetadataIteratorRecord(n, m)
}

func (b both) SnapshotMetadataIteratorDone(n int) error { return b.v.SnapshotMetadataIteratorDone(n) }

func main() {
	var args iterator.Args
	var source, target string
	flag.StringVar(&args.Namespace, "namespace", "", "the VolumeSnapshots' namespace")
	flag.StringVar(&args.SnapshotName, "snapshot", "", "the VolumeSnapshot to list")
	flag.StringVar(&args.PrevSnapshotName, "prev-snapshot", "", "the base VolumeSnapshot (changed blocks); empty: the allocated blocks")
	flag.StringVar(&args.PrevSnapshotID, "prev-snapshot-id", "", "the base snapshot's CSI handle, instead of -prev-snapshot")
	flag.Int64Var(&args.StartingOffset, "starting-offset", 0, "starting_offset")
	max := flag.Int("max-results", 0, "max_results (0: the driver's choice)")
	flag.StringVar(&source, "verify-source", "", "with -verify-target: the device to copy the changed ranges from (a restore of -snapshot)")
	flag.StringVar(&target, "verify-target", "", "the device to copy them onto (a restore of -prev-snapshot), then compared with the source")
	timeout := flag.Duration("timeout", 2*time.Minute, "how long the whole listing may take")
	flag.Parse()
	args.MaxResults = int32(*max)

	res := &result{Ranges: [][2]int64{}}
	err := run(args, source, target, *timeout, res)
	if err != nil {
		res.Error = err.Error()
		if s, ok := status.FromError(err); ok {
			res.Code = s.Code().String()
		}
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot-metadata-client:", err)
		os.Exit(1)
	}
}

func run(args iterator.Args, source, target string, timeout time.Duration, res *result) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	if args.Clients, err = iterator.BuildClients(cfg); err != nil {
		return err
	}
	c := &collector{max: args.MaxResults, res: res}
	args.Emitter = c
	if source != "" || target != "" {
		if source == "" || target == "" {
			return errors.New("-verify-source and -verify-target go together")
		}
		src, err := os.Open(source)
		if err != nil {
			return err
		}
		defer src.Close()
		dst, err := os.OpenFile(target, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer dst.Close()
		args.Emitter = both{c: c, v: &iterator.VerifierEmitter{SourceDevice: src, TargetDevice: dst}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := iterator.GetSnapshotMetadata(ctx, args); err != nil {
		return err
	}
	res.Verified = source != ""
	return nil
}
