package identity

import (
	"strings"
	"testing"
)

func TestOnlyTheAccountThePoliciesNameStarts(t *testing.T) {
	for _, tc := range []struct {
		name, username, want, says string
	}{
		{"the controller as installed", Controller, Controller, ""},
		{"the agent as installed", Agent, Agent, ""},
		{"installed in another namespace", "system:serviceaccount:tools:lifeboat-controller", Controller,
			"running as system:serviceaccount:tools:lifeboat-controller, but lifeboat's admission policies (manifests/) hold " + Controller},
		{"a renamed service account", "system:serviceaccount:lifeboat-system:agent", Agent, "--policy-user=system:serviceaccount:lifeboat-system:agent"},
		{"the controller's account running the agent", Controller, Agent, "would not apply"},
		{"an admin's credentials, as test clusters run an agent", "kubernetes-admin", Agent, ""},
		{"the policies rewritten for this account", "system:serviceaccount:tools:lifeboat-controller", "system:serviceaccount:tools:lifeboat-controller", ""},
	} {
		err := decide(tc.username, tc.want)
		if tc.says == "" && err != nil {
			t.Errorf("%s: %v, want it to start", tc.name, err)
		}
		if tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("%s: %v, want it refused saying %q", tc.name, err, tc.says)
		}
	}
}
