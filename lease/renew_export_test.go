package lease

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SchedLag is how much earlier than their deadlines s's renewer now ends
// sessions, before the cap of a quarter of the TTL.
func SchedLag(s *Session) time.Duration { return s.renewer.Lag(time.Now()) }

// DelayLease is s's delay lease; 0 if it has none.
func DelayLease(s *Session) clientv3.LeaseID { return clientv3.LeaseID(s.delayID.Load()) }
