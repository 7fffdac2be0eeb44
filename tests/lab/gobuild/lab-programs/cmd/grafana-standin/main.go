// Command grafana-standin stands in for Grafana in the lab, under docker.io/grafana/grafana's name, because
// Grafana cannot be built here: the Go proxy refuses github.com/grafana/grafana at the pinned v10.4.2 (403,
// "This module version is not available"), and its web UI is a TypeScript build.
//
// It is as narrow as the product's use of Grafana allows: it reads what the monitoring role provisions
// (GF_PATHS_PROVISIONING: datasources/*.yml and dashboards/*.yml; the dashboard JSON files the provider's
// path points at) and answers Grafana's health endpoint, GET /api/health, 200 only once every provisioned
// file is there and every dashboard parses as JSON with a uid and a title (Grafana refuses to load one
// without). Everything else answers 501: no UI, no API, no dashboards rendered.
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

const version = "10.4.2"

// dashboardPath finds `path: <dir>` in a dashboards provider file (Grafana's `options.path`).
var dashboardPath = regexp.MustCompile(`(?m)^\s*path:\s*['"]?([^'"\s]+)`)

// check returns why the provisioning is not loadable, or "".
func check(provisioning string) string {
	for _, kind := range []string{"datasources", "dashboards"} {
		files, _ := filepath.Glob(filepath.Join(provisioning, kind, "*.yml"))
		if len(files) == 0 {
			return fmt.Sprintf("no %s provisioning file in %s", kind, filepath.Join(provisioning, kind))
		}
	}
	providers, _ := filepath.Glob(filepath.Join(provisioning, "dashboards", "*.yml"))
	for _, provider := range providers {
		text, err := os.ReadFile(provider)
		if err != nil {
			return err.Error()
		}
		for _, match := range dashboardPath.FindAllStringSubmatch(string(text), -1) {
			dashboards, _ := filepath.Glob(filepath.Join(match[1], "*.json"))
			if len(dashboards) == 0 {
				return fmt.Sprintf("%s: no dashboard in %s", provider, match[1])
			}
			for _, dashboard := range dashboards {
				if reason := checkDashboard(dashboard); reason != "" {
					return reason
				}
			}
		}
	}
	return ""
}

func checkDashboard(path string) string {
	text, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var dashboard map[string]any
	if err := json.Unmarshal(text, &dashboard); err != nil {
		return fmt.Sprintf("%s: not JSON: %v", path, err)
	}
	for _, key := range []string{"uid", "title"} {
		if value, _ := dashboard[key].(string); strings.TrimSpace(value) == "" {
			return fmt.Sprintf("%s: no %s", path, key)
		}
	}
	return ""
}

func main() {
	provisioning := os.Getenv("GF_PATHS_PROVISIONING")
	if provisioning == "" {
		provisioning = "/etc/grafana/provisioning"
	}
	http.HandleFunc("/api/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if reason := check(provisioning); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"database": "failing", "message": reason})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"commit": "lab-stand-in", "database": "ok", "version": version})
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "grafana is not built in the lab (docs/lab.md): only /api/health is answered", http.StatusNotImplemented)
	})
	if reason := check(provisioning); reason != "" {
		log.Printf("provisioning not loadable yet: %s", reason)
	}
	log.Printf("grafana stand-in %s listening on :3000 (provisioning %s)", version, provisioning)
	log.Fatal(http.ListenAndServe(":3000", nil))
}
