package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mefor/mefor/testcontainers/fixtures"
)

// The binary is built once per test process and shared by every test in it.
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary is the path of a mefor binary built from this module's cmd/mefor,
// built on first use.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mefor-e2e-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "mefor")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/mefor/mefor/cmd/mefor").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// Proc is a running mefor process whose output is kept for the test log.
type Proc struct {
	Cmd *exec.Cmd
	Out *fixtures.SyncBuffer
}

// StartProc starts `mefor ARGS` in dir with env added to this process's
// environment. The process is killed when the test ends, and its output
// logged if the test failed.
func StartProc(t *testing.T, dir string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Cmd: cmd, Out: &fixtures.SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mefor %v: %v", args, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("output of mefor %v:\n%s", args, p.Out.String())
		}
	})
	return p
}

// Stop sends sig and waits for the process to exit.
func (p *Proc) Stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	_ = p.Cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = p.Cmd.Process.Kill()
		t.Fatalf("mefor %v did not exit within 60s of %v", p.Cmd.Args[1:], sig)
	}
}

// RunMefor runs `mefor ARGS` to its end and returns its combined output.
func RunMefor(t *testing.T, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// WaitListening fails the test when nothing accepts a connection on addr
// within 60s.
func WaitListening(t *testing.T, addr string) {
	t.Helper()
	if !AwaitListener(addr, 60*time.Second) {
		t.Fatalf("nothing listening on %s after 60s", addr)
	}
}

// AwaitListener reports whether something accepted a connection on addr
// within timeout. It does not touch a testing.T, so a test's sender
// goroutine can wait with it for a restarted node.
func AwaitListener(addr string, timeout time.Duration) bool {
	return fixtures.Within(timeout, 50*time.Millisecond, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// Eventually fails the test when cond has not held within timeout,
// checking it every 50ms.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	fixtures.Poll(t, timeout, 50*time.Millisecond, what, cond)
}
