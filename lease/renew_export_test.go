package lease

import "time"

// SchedLag is how much earlier than their deadlines s's renewer now ends
// sessions, before the cap of a quarter of the TTL.
func SchedLag(s *Session) time.Duration { return s.renewer.Lag(time.Now()) }
