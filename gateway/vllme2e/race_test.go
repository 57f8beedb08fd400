//go:build race

package vllme2e_test

const raceEnabled = true
