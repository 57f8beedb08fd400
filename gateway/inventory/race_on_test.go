//go:build race

package inventory

// raceEnabled shortens the single-goroutine model test under -race, which checks logic rather
// than synchronization and runs ten times slower there.
const raceEnabled = true
