package route

// LastKey is the key of the prompt's deepest full block as the gateway computed it (its chain
// covers the whole keyed prompt), false when the decision computed no keys. The gateway's
// token-side check (router binding) looks for it in the engine's published blocks.
func (d *Decision) LastKey() (uint64, bool) {
	if d == nil || len(d.keys) == 0 {
		return 0, false
	}
	return d.keys[len(d.keys)-1], true
}
