package monitoring

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const dashboardFile = "../../manifests/monitoring/dashboard.json"

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// grafanaIntervals are the interval variables Grafana substitutes before a query reaches
// Prometheus; a range of five minutes stands for them in the parser.
var grafanaIntervals = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "5m", "$__range", "5m")

// labelValues is a query variable's label_values(SELECTOR, LABEL), whose selector is PromQL.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// TestTheDashboardQueriesOnlyRegisteredMetrics: every panel's queries, and the node variable's,
// parse and select only metrics lifeboat registers, by labels they carry.
func TestTheDashboardQueriesOnlyRegisteredMetrics(t *testing.T) {
	registered := registered(t)
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: want a title, a uid and panels", dashboardFile)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d taken by another panel", p.Title, p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, target := range p.Targets {
			queried(t, registered, grafanaIntervals.Replace(target.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(SELECTOR, LABEL)", v.Name, q.Query)
			continue
		}
		queried(t, registered, m[1])
	}
}

// TestTheDashboardShowsWhatAnOperatorAsksFor: a panel for each thing issue 46 lists, each
// querying the metrics that show it (one panel for a node's memory and the lines against it).
func TestTheDashboardShowsWhatAnOperatorAsksFor(t *testing.T) {
	registered := registered(t)
	d := readDashboard(t)
	for _, want := range []struct {
		what    string
		metrics []string
	}{
		{"evacuations in flight", []string{"lifeboat_migrations"}},
		{"time left to each deadline", []string{"lifeboat_migration_deadline_timestamp_seconds"}},
		{"guest stop time distribution", []string{"lifeboat_agent_migration_downtime_seconds_bucket"}},
		{"each node's memory.available against its thresholds and relief line", []string{
			"lifeboat_agent_node_memory_available_bytes", "lifeboat_agent_node_memory_eviction_threshold_bytes", "lifeboat_agent_node_pressure_relief_line_bytes"}},
		{"migrations by cause and outcome", []string{"lifeboat_migrations_ended_total"}},
	} {
		found := slices.ContainsFunc(d.Panels, func(p panel) bool {
			var names []string
			for _, target := range p.Targets {
				names = append(names, queried(t, registered, grafanaIntervals.Replace(target.Expr))...)
			}
			return !slices.ContainsFunc(want.metrics, func(m string) bool { return !slices.Contains(names, m) })
		})
		if !found {
			t.Errorf("no panel shows %s (querying %v)", want.what, want.metrics)
		}
	}
}

// TestTheKustomizationShipsTheAlertsAndTheDashboard: kubectl apply -k manifests/monitoring
// creates the PrometheusRule and the dashboard's ConfigMap for Grafana's sidecar.
func TestTheKustomizationShipsTheAlertsAndTheDashboard(t *testing.T) {
	data, err := os.ReadFile("../../manifests/monitoring/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type generator struct {
		Files   []string `yaml:"files"`
		Options struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"options"`
	}
	var k struct {
		Resources          []string    `yaml:"resources"`
		ConfigMapGenerator []generator `yaml:"configMapGenerator"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(k.Resources, "prometheusrule.yaml") {
		t.Errorf("resources %v: want prometheusrule.yaml", k.Resources)
	}
	shipped := slices.ContainsFunc(k.ConfigMapGenerator, func(g generator) bool {
		return g.Options.Labels["grafana_dashboard"] != "" && slices.ContainsFunc(g.Files, func(f string) bool {
			return f == "dashboard.json" || strings.HasSuffix(f, "=dashboard.json")
		})
	})
	if !shipped {
		t.Error("no ConfigMap labelled grafana_dashboard holds dashboard.json")
	}
}
