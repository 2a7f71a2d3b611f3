// Command rclone is rclone v1.76.0 (github.com/rclone/rclone, MIT licence) with only what the
// object-bucket example uses: the local and S3 backends, `serve s3` (the example's in-cluster
// object store) and `mount2` (its FUSE client, on go-fuse), plus the file commands its pods run
// and `rc` (the staging pod asks its mount for pending uploads before unmounting). Upstream's
// own main (github.com/rclone/rclone/rclone.go) imports every backend and command; building
// this subset takes a fraction of the time. Built by hack/build-tools.sh into _output/bin/rclone,
// from the module's source with examples/object-bucket/rclone-close-to-open.patch applied
// (patched-source.sh).
package main

import (
	_ "github.com/rclone/rclone/backend/local"
	_ "github.com/rclone/rclone/backend/s3"
	"github.com/rclone/rclone/cmd"
	_ "github.com/rclone/rclone/cmd/cat"
	_ "github.com/rclone/rclone/cmd/copyto"
	_ "github.com/rclone/rclone/cmd/delete"
	_ "github.com/rclone/rclone/cmd/ls"
	_ "github.com/rclone/rclone/cmd/lsd"
	_ "github.com/rclone/rclone/cmd/lsf"
	_ "github.com/rclone/rclone/cmd/mkdir"
	_ "github.com/rclone/rclone/cmd/mount2"
	_ "github.com/rclone/rclone/cmd/purge"
	_ "github.com/rclone/rclone/cmd/rc"
	_ "github.com/rclone/rclone/cmd/rcat"
	_ "github.com/rclone/rclone/cmd/rmdir"
	_ "github.com/rclone/rclone/cmd/serve"
	_ "github.com/rclone/rclone/cmd/serve/s3"
	_ "github.com/rclone/rclone/cmd/size"
	_ "github.com/rclone/rclone/cmd/touch"
	_ "github.com/rclone/rclone/cmd/version"
)

func main() {
	cmd.Main()
}
