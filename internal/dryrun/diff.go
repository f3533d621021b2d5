package dryrun

// Diff marks the segments of one of r's outputs against the message r
// ran on: "  " the same, "~ " changed (same segment id and occurrence),
// "+ " added; input segments the output lacks follow as "- ". A result
// whose message did not parse has no outputs, and Diff returns nil for it.
func (r *Result) Diff(o Output) []string {
	if r.input == nil {
		return nil
	}
	return diffSegments(segmentTexts(r.input), o.Segments)
}

func diffSegments(in, out []string) []string {
	type occ struct {
		id string
		n  int
	}
	inText := map[occ]string{}
	count := map[string]int{}
	var order []occ
	for _, s := range in {
		id := segID(s)
		count[id]++
		o := occ{id, count[id]}
		inText[o] = s
		order = append(order, o)
	}
	seen := map[occ]bool{}
	count = map[string]int{}
	var lines []string
	for _, s := range out {
		id := segID(s)
		count[id]++
		o := occ{id, count[id]}
		seen[o] = true
		prev, ok := inText[o]
		switch {
		case !ok:
			lines = append(lines, "+ "+s)
		case prev != s:
			lines = append(lines, "~ "+s)
		default:
			lines = append(lines, "  "+s)
		}
	}
	for _, o := range order {
		if !seen[o] {
			lines = append(lines, "- "+inText[o])
		}
	}
	return lines
}

func segID(s string) string {
	if len(s) < 3 {
		return s
	}
	return s[:3]
}
