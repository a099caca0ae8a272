package etcdtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Snapshot saves a snapshot of the running member to a file in its data
// directory's parent, as etcdutl snapshot save does, and returns its path.
func (m *Member) Snapshot(ctx context.Context) (string, error) {
	path := filepath.Join(filepath.Dir(m.cfg.Dir), m.Name+".snapshot.db")
	_, err := snapshot.NewV3(zap.NewNop()).Save(ctx, clientv3.Config{Endpoints: []string{m.ClientURL}, Logger: zap.NewNop()}, path)
	if err != nil {
		return "", fmt.Errorf("etcdtest: snapshot: %w", err)
	}
	return path, nil
}

// RestoreFrom stops a single member, replaces its data with the snapshot
// at path, as etcdutl snapshot restore does (with bump > 0: --bump-revision
// bump --mark-compacted), and starts it again on the same URLs.
func (m *Member) RestoreFrom(ctx context.Context, path string, bump uint64) error {
	m.Stop()
	dir := m.cfg.Dir + ".restored"
	os.RemoveAll(dir)
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        path,
		Name:                m.Name,
		OutputDataDir:       dir,
		PeerURLs:            []string{m.PeerURL},
		InitialCluster:      m.Name + "=" + m.PeerURL,
		InitialClusterToken: m.cfg.InitialClusterToken,
		RevisionBump:        bump,
		MarkCompacted:       bump > 0,
	})
	if err != nil {
		return fmt.Errorf("etcdtest: restore: %w", err)
	}
	old := m.cfg.Dir
	m.cfg.Dir = dir
	m.cfg.ClusterState = embed.ClusterStateFlagNew
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("etcdtest: restore: %w", err)
	}
	return m.start(ctx)
}
