package fenceotel_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasefence/leasefence/fence/fenceotel"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A contended handoff, then a loss, as spans and metrics: each Lock span is
// a child of its caller's span, the second's queue time covers the first's
// holding from the second's enqueue to the release, the Unlock span links
// to the Lock span it ends, and the loss is a span linked to its Lock's.
func TestHandoffAndLossSpans(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := etcdproc.Name(t, "otel")
	hooks := k.tel.LeaseHooks()
	queued := make(chan struct{}, 4)
	count := hooks.Waiting
	hooks.Waiting = func(name string, delta int) {
		count(name, delta)
		if delta > 0 {
			queued <- struct{}{}
		}
	}
	session := func() *lease.Session {
		s, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second), lease.WithHooks(hooks))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := session(), session()
	tracer := k.tp.Tracer("test")

	actx, reqA := tracer.Start(ctx, "request A")
	la, err := a.Lock(actx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lease.Lock, 1)
	bctx, reqB := tracer.Start(ctx, "request B")
	go func() {
		l, err := b.Lock(bctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-queued:
	case <-ctx.Done():
		t.Fatal("B never waited")
	}
	k.want(t, fenceotel.MetricWaiting, 1, fenceotel.AttrLockName.String(name))
	if err := la.Unlock(actx); err != nil {
		t.Fatal(err)
	}
	reqA.End()
	lb := <-got
	reqB.End()
	if lb == nil {
		t.FailNow()
	}

	locks := k.ended("lease.Lock")
	unlocks := k.ended("lease.Unlock")
	if len(locks) != 2 || len(unlocks) != 1 {
		t.Fatalf("%d Lock spans and %d Unlock spans, want 2 and 1", len(locks), len(unlocks))
	}
	spanA, spanB, unlockA := locks[0], locks[1], unlocks[0]
	if spanA.Parent().SpanID() != reqA.SpanContext().SpanID() || spanB.Parent().SpanID() != reqB.SpanContext().SpanID() {
		t.Errorf("Lock spans are not children of their callers' spans")
	}
	if unlockA.Parent().SpanID() != reqA.SpanContext().SpanID() {
		t.Errorf("Unlock span is not a child of its caller's span")
	}
	wantHandoff(t, name, spanA, spanB, unlockA, la.Token(), lb.Token())

	// A loss: B's key is deleted by someone else.
	if _, err := cli.Delete(ctx, lb.Key()); err != nil {
		t.Fatal(err)
	}
	<-lb.Done()
	wantLoss(t, k, spanB, "key_deleted")
	k.want(t, fenceotel.MetricLosses, 1, fenceotel.AttrLockName.String(name), fenceotel.AttrCause.String("key_deleted"))
	k.want(t, fenceotel.MetricAcquire, 2, fenceotel.AttrLockName.String(name))
	k.want(t, fenceotel.MetricHeld, 0, fenceotel.AttrLockName.String(name))
	k.want(t, fenceotel.MetricWaiting, 0, fenceotel.AttrLockName.String(name))
}

// wantHandoff checks the spans of a handoff from A to B: both granted,
// B queued behind A, before A's Unlock started and granted after, and A's
// Unlock linked to its Lock and marked with the release.
func wantHandoff(t *testing.T, name string, spanA, spanB, unlockA sdktrace.ReadOnlySpan, tokenA, tokenB int64) {
	t.Helper()
	for _, s := range []sdktrace.ReadOnlySpan{spanA, spanB} {
		wantAttr(t, s, fenceotel.AttrLockName.String(name))
		wantAttr(t, s, fenceotel.AttrMode.String("write"))
		wantAttr(t, s, fenceotel.AttrOutcome.String("granted"))
		if s.Status().Code == codes.Error {
			t.Errorf("%s: status %v", s.Name(), s.Status())
		}
	}
	wantAttr(t, spanA, fenceotel.AttrToken.Int64(tokenA))
	wantAttr(t, spanB, fenceotel.AttrToken.Int64(tokenB))
	wantAttr(t, spanA, fenceotel.AttrAhead.Int(0))
	wantAttr(t, spanB, fenceotel.AttrAhead.Int(1))
	// B queued before A's release started, and was granted after it did:
	// its queue time covers the rest of A's holding.
	q, ok := event(spanB, "queued")
	if !ok {
		t.Fatal("B's span has no queued event")
	}
	if !q.Time.Before(unlockA.StartTime()) || !spanB.EndTime().After(unlockA.StartTime()) {
		t.Errorf("B queued at %v and was granted at %v; A's Unlock started at %v", q.Time, spanB.EndTime(), unlockA.StartTime())
	}
	if v, ok := attr(spanB, fenceotel.AttrQueueTime); !ok || v.AsFloat64() < unlockA.StartTime().Sub(q.Time).Seconds() {
		t.Errorf("B's queue time %v is shorter than A's holding after B queued (%v)", v.AsFloat64(), unlockA.StartTime().Sub(q.Time))
	}
	wantLinked(t, unlockA, spanA)
	if e, ok := event(unlockA, "ended"); !ok || !has(attribute.NewSet(e.Attributes...), []attribute.KeyValue{fenceotel.AttrCause.String("released")}) {
		t.Errorf("Unlock span has no ended event with cause released: %v", unlockA.Events())
	}
}

// wantLoss checks the span of a holding's loss: a root of its own, linked
// to the span of the call that took the holding, with the cause.
func wantLoss(t *testing.T, k *kit, acquired sdktrace.ReadOnlySpan, cause string) {
	t.Helper()
	ends := k.ended(fenceotel.SpanHoldingEnd)
	if len(ends) != 1 {
		t.Fatalf("%d holding-end spans after the loss, want 1", len(ends))
	}
	end := ends[0]
	wantAttr(t, end, fenceotel.AttrCause.String(cause))
	if v, _ := attr(acquired, fenceotel.AttrLockName); !has(attribute.NewSet(end.Attributes()...), []attribute.KeyValue{fenceotel.AttrLockName.String(v.AsString())}) {
		t.Errorf("loss span does not name the lock %q", v.AsString())
	}
	if end.Status().Code != codes.Error {
		t.Errorf("loss span status %v, want Error", end.Status())
	}
	if end.Parent().IsValid() {
		t.Errorf("loss span has a parent: %v", end.Parent())
	}
	wantLinked(t, end, acquired)
}

// A TryLock that finds the lock taken is no error; a Lock whose ctx ends
// is, and a Resign links to its Campaign. Names are mapped on metrics only.
func TestTryLockCancelAndCampaignSpans(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t, fenceotel.WithNameAttribute(func(string) string { return "" }))
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := etcdproc.Name(t, "try")
	newSession := func() *lease.Session {
		s, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second), lease.WithHooks(k.tel.LeaseHooks()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := newSession(), newSession()
	le, err := a.Campaign(ctx, name, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, name); err == nil {
		t.Fatal("TryLock took a held lock")
	}
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = b.RLock(short, name)
	stop()
	if err == nil {
		t.Fatal("RLock took a lock held by a leader")
	}
	if err := le.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	try := k.ended("lease.TryLock")
	rlock := k.ended("lease.RLock")
	camp := k.ended("lease.Campaign")
	resign := k.ended("lease.Resign")
	if len(try) != 1 || len(rlock) != 1 || len(camp) != 1 || len(resign) != 1 {
		t.Fatalf("spans: %d TryLock, %d RLock, %d Campaign, %d Resign; want one each", len(try), len(rlock), len(camp), len(resign))
	}
	wantAttr(t, try[0], fenceotel.AttrOutcome.String("locked"))
	if try[0].Status().Code == codes.Error {
		t.Errorf("TryLock refused: status %v, want unset", try[0].Status())
	}
	wantAttr(t, rlock[0], fenceotel.AttrOutcome.String("deadline_exceeded"))
	wantAttr(t, rlock[0], fenceotel.AttrMode.String("read"))
	if rlock[0].Status().Code != codes.Error {
		t.Errorf("RLock timed out: status %v, want Error", rlock[0].Status())
	}
	if links := resign[0].Links(); len(links) != 1 || links[0].SpanContext.SpanID() != camp[0].SpanContext().SpanID() {
		t.Errorf("Resign span links %v, want the Campaign span", links)
	}
	if n := len(k.ended(fenceotel.SpanHoldingEnd)); n != 0 {
		t.Errorf("%d holding-end spans for a holding Resign ended", n)
	}
	// The map left the name out of the metrics: one series, no name.
	k.want(t, fenceotel.MetricAcquire, 1)
	k.want(t, fenceotel.MetricAcquire, 0, fenceotel.AttrLockName.String(name))
}

// A span that is not recorded costs no hooks: nothing is linked to it.
func TestUnsampledCallTakesNoHooks(t *testing.T) {
	k := newKit(t)
	h := k.tel.LeaseHooks()
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1},
	}))
	// A parent that is not sampled: the SDK's default sampler follows it.
	if _, ch := h.Call(ctx, lease.Call{Op: "Lock", Name: "n"}); ch != nil {
		t.Errorf("hooks for a call whose span is not sampled")
	}
}

// A session whose lease is revoked: the session loss is counted, and its
// lock's end is a loss span with the cause the lock heard.
func TestSessionLossCounted(t *testing.T) {
	etcdproc.LeakCheck(t)
	k := newKit(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := etcdproc.Name(t, "revoked")
	s, err := lease.NewSession(ctx, cli, lease.WithTTL(2*time.Second), lease.WithHooks(k.tel.LeaseHooks()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	<-s.Done()
	k.want(t, fenceotel.MetricSessionLosses, 1)
	cause := lease.Cause(l.Err())
	locks := k.ended("lease.Lock")
	if len(locks) != 1 {
		t.Fatalf("%d Lock spans, want 1", len(locks))
	}
	wantLoss(t, k, locks[0], cause)
	k.want(t, fenceotel.MetricLosses, 1, fenceotel.AttrCause.String(cause))
	if v := k.metric(t, fenceotel.MetricMargin); v < 1 {
		t.Errorf("%s count = %v, want one renewal at least", fenceotel.MetricMargin, v)
	}
}
