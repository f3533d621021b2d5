package testcontainers

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
)

// settings reads fsync, synchronous_commit, full_page_writes and the file
// system type of the data directory, from the server itself.
func settings(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (fsync, syncCommit, fpw, fstype string) {
	t.Helper()
	var dataDir, mounts string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('full_page_writes'), current_setting('data_directory'), pg_read_file('/proc/self/mounts')`).
		Scan(&fsync, &syncCommit, &fpw, &dataDir, &mounts); err != nil {
		t.Fatalf("read settings: %v", err)
	}
	best := ""
	for _, line := range strings.Split(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[1] == dataDir || strings.HasPrefix(dataDir, strings.TrimSuffix(f[1], "/")+"/")) && len(f[1]) >= len(best) {
			best, fstype = f[1], f[2]
		}
	}
	return fsync, syncCommit, fpw, fstype
}

// The test suite's server trades durability for speed: a test run that
// suddenly paid an fsync per commit would be several times slower.
func TestSuiteServerIsFast(t *testing.T) {
	t.Parallel()
	db := NewDB(t)
	fsync, syncCommit, fpw, fstype := settings(context.Background(), t, db.Pool)
	if fsync != "off" || syncCommit != "off" || fpw != "off" || fstype != "tmpfs" {
		t.Fatalf("test server: fsync=%s synchronous_commit=%s full_page_writes=%s data on %s, want off, off, off, tmpfs",
			fsync, syncCommit, fpw, fstype)
	}
}

// With MEFOR_PG_DURABLE=1 (task bench) a commit costs what it costs in
// production: the settings stay on and the data is on disk, and the volume
// holding it goes away with the container.
func TestDurableServerIsDurableAndLeavesNoVolume(t *testing.T) {
	t.Setenv("MEFOR_PG_DURABLE", "1")
	ctx := context.Background()
	s, err := StartServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	terminated := false
	defer func() {
		if !terminated {
			s.Terminate(ctx)
		}
	}()
	fsync, syncCommit, fpw, fstype := settings(ctx, t, s.admin)
	if fsync != "on" || syncCommit != "on" || fpw != "on" || fstype == "tmpfs" || fstype == "" {
		t.Fatalf("durable server: fsync=%s synchronous_commit=%s full_page_writes=%s data on %q, want on, on, on, a disk",
			fsync, syncCommit, fpw, fstype)
	}
	vol := dataVolume(ctx, t, s.container.GetContainerID())
	if !volumeExists(ctx, t, vol) {
		t.Fatalf("volume %s not found while its container runs: the test proves nothing", vol)
	}
	s.Terminate(ctx)
	terminated = true
	if volumeExists(ctx, t, vol) {
		t.Fatalf("volume %s outlived its terminated container", vol)
	}
}

// A durable container of a killed test binary is swept with its volume.
func TestKilledBinaryDurableVolumeIsSwept(t *testing.T) {
	ctx := context.Background()
	cmd, id := startHangingHelper(t, "MEFOR_PG_DURABLE=1")
	vol := dataVolume(ctx, t, id)
	kill(cmd)
	wantSwept(ctx, t, "volume "+vol, func() bool { return volumeExists(ctx, t, vol) })
}

// dataVolume is the name of the volume mounted on the container's data
// directory; the test fails if there is none.
func dataVolume(ctx context.Context, t *testing.T, id string) string {
	t.Helper()
	res, err := dockerClient(ctx, t).ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res.Container.Mounts {
		if m.Type == mount.TypeVolume && m.Destination == dataDir {
			return m.Name
		}
	}
	t.Fatalf("container %s has no volume on %s", id, dataDir)
	return ""
}

func volumeExists(ctx context.Context, t *testing.T, name string) bool {
	t.Helper()
	_, err := dockerClient(ctx, t).VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	return err == nil
}
