package lease_test

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Each state change of a lock is logged once, at a level that fits it,
// with key, token and lease.
func TestLockStateChangesLoggedOnce(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	core, logs := observer.New(zapcore.DebugLevel)
	s := newSession(t, cli, lease.WithLogger(zap.New(core)))
	name := etcdproc.Name(t, "logs")
	released := mustLock(t, s, name)
	if err := released.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	lost := mustLock(t, s, name)
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), lost.Key()); err != nil {
		t.Fatal(err)
	}
	<-lost.Done()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		msg   string
		level zapcore.Level
		n     int
		cause string
	}{
		{"session started", zapcore.InfoLevel, 1, ""},
		{"lock granted", zapcore.InfoLevel, 2, ""},
		{"lock released", zapcore.InfoLevel, 1, "released"},
		{"lock lost", zapcore.WarnLevel, 1, "key_deleted"},
	} {
		entries := logs.FilterMessage(want.msg).All()
		if len(entries) != want.n {
			t.Errorf("%q logged %d times, want %d", want.msg, len(entries), want.n)
			continue
		}
		for _, e := range entries {
			fields := e.ContextMap()
			if e.Level != want.level || fields["lease"] == nil || (want.msg != "session started" && (fields["key"] == nil || fields["token"] == nil)) {
				t.Errorf("%q: level %v, fields %v", want.msg, e.Level, fields)
			}
			if want.cause != "" && fields["cause"] != want.cause {
				t.Errorf("%q: cause %v, want %s", want.msg, fields["cause"], want.cause)
			}
		}
	}
}
