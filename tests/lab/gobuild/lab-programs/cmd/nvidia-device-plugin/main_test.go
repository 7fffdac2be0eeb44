package main

import (
	"strings"
	"testing"
)

func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		args  []string
		check func(cfg config) bool
		error string
	}{
		{nil, nil, func(c config) bool { return c.failOnInitError && c.idStrategy == "uuid" }, ""},
		{map[string]string{"FAIL_ON_INIT_ERROR": "false"}, nil, func(c config) bool { return !c.failOnInitError }, ""},
		{nil, []string{"--fail-on-init-error=false"}, func(c config) bool { return !c.failOnInitError }, ""},
		{map[string]string{"FAIL_ON_INIT_ERROR": "nope"}, nil, nil,
			`could not parse "nope" as bool value from env FAIL_ON_INIT_ERROR for flag fail-on-init-error`},
		{map[string]string{"DEVICE_ID_STRATEGY": "index"}, nil, func(c config) bool { return c.idStrategy == "index" }, ""},
		{map[string]string{"DEVICE_ID_STRATEGY": "serial"}, nil, nil, "invalid --device-id-strategy option: serial"},
		{map[string]string{"MIG_STRATEGY": "single"}, nil, func(c config) bool { return true }, ""},
		{map[string]string{"MIG_STRATEGY": "half"}, nil, nil, "invalid --mig-strategy option: half"},
		{map[string]string{"DEVICE_LIST_STRATEGY": "cdi-cri"}, nil, nil, "passes devices by envvar only"},
		{map[string]string{"PASS_DEVICE_SPECS": "true"}, nil, nil, "not stood in"},
		{map[string]string{"CONFIG_FILE": "/etc/dp.yaml"}, nil, nil, "reads no config file"},
		{nil, []string{"--no-such-flag"}, nil, "flag provided but not defined: -no-such-flag"},
	} {
		t.Run(strings.Join(tc.args, " ")+tc.error, func(t *testing.T) {
			quietLogs(t)
			for _, name := range []string{"FAIL_ON_INIT_ERROR", "DEVICE_ID_STRATEGY", "MIG_STRATEGY",
				"DEVICE_LIST_STRATEGY", "PASS_DEVICE_SPECS", "CONFIG_FILE"} {
				t.Setenv(name, tc.env[name])
			}
			cfg, _, err := parseConfig(tc.args)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("error %v, want %q", err, tc.error)
				}
				return
			}
			if err != nil || !tc.check(cfg) {
				t.Fatalf("%+v, %v", cfg, err)
			}
		})
	}
}
