package values

// Overlay returns base with over merged on top, as Sylva merges what a
// cluster's chart sees: Flux merges a HelmRelease's inline values over its
// valuesFrom this way, and sylva-library's mergeOverwrite merges the levels
// of capm3 values (root, then control_plane or machine_deployment_default,
// then the machine deployment) this way. Maps merge key by key; any other
// value of over, a null included, replaces base's. Unlike Merge, a null is
// kept as a value, not removed: what reads the result then sees it (an
// os_image_selector pattern that is null is refused, as Sylva refuses it).
//
// The result shares nothing with its inputs.
func Overlay(base, over Values) Values {
	out := make(Values, len(base)+len(over))
	for k, v := range base {
		out[k] = DeepCopy(v)
	}
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = Overlay(bm, om)
			continue
		}
		out[k] = DeepCopy(v)
	}
	return out
}

// DeepCopy copies the maps and lists of a values tree, so that the copy
// shares nothing a caller could edit with the original.
func DeepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = DeepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = DeepCopy(e)
		}
		return out
	default:
		return v
	}
}
