package systemd

import (
	_ "embed"
	"strings"
)

//go:embed hearthd.service
var hearthdUnit string

//go:embed hearth-control.service
var controlUnit string

// HearthdEnvironment returns the variables hearthd.service sets for
// hearthd (its Environment= lines), so that what starts hearthd outside
// systemd, the benchmark, runs it as the unit does.
func HearthdEnvironment() []string { return unitEnvironment(hearthdUnit) }

// ControlEnvironment returns the variables hearth-control.service sets,
// for the fleet benchmark and make run.
func ControlEnvironment() []string { return unitEnvironment(controlUnit) }

// unitEnvironment returns the assignments of unit's Environment= lines.
// They are written unquoted (TestUnitEnvironment), so splitting at
// spaces is systemd's own reading of them.
func unitEnvironment(unit string) []string {
	var env []string
	for line := range strings.Lines(unit) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Environment="); ok {
			env = append(env, strings.Fields(v)...)
		}
	}
	return env
}
