// Package delayrec is the lock-delay record of a name: its format, and
// the one decision a lock makes from it when its turn comes (Next). It
// does no I/O; package lease reads and writes the record.
//
// A record names one holding by its token and says whether it is held,
// lost or released, and with what delay. Next never lets a lock proceed
// past a record that names an earlier holding as held or lost: the lock
// records the loss or waits for the record to change.
package delayrec
