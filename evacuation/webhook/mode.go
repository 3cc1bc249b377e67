package webhook

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// ClientAuth is --webhook-client-auth: whether the webhook may ever act on a review whose caller
// it cannot authenticate.
type ClientAuth string

const (
	// ClientAuthAuto: permissive until the API server has once presented its client certificate
	// (to any replica, recorded in the LifeboatConfig's status), strict from then on.
	ClientAuthAuto ClientAuth = "auto"
	// ClientAuthStrict: strict from the start, for clusters known to present the certificate.
	ClientAuthStrict ClientAuth = "strict"
)

// Mode is how the webhook treats a review whose caller it cannot authenticate.
type Mode string

const (
	// ModeStrict refuses it (403) before reading it, with no side effect.
	ModeStrict Mode = "strict"
	// ModePermissive acts on it within Unauthenticated's bounds, as KubeVirt's webhook acts on
	// every review: only where the API server has never authenticated itself.
	ModePermissive Mode = "permissive"
)

// Reasons of the mode: the LifeboatConfig's EvictionWebhookStrict condition and the start-up log.
const (
	ReasonStrictByFlag            = "StrictByFlag"
	ReasonAuthenticatedCallSeen   = "AuthenticatedCallSeen"
	ReasonNoAuthenticatedCallSeen = "NoAuthenticatedCallSeen"
	ReasonNoClientCA              = "NoClientCA"
)

// ModeOf is the webhook's mode and its reason: strict by flag, or once an authenticated call has
// been seen (the ratchet, which nothing in the webhook undoes); permissive otherwise. haveCA says
// whether --webhook-client-ca was given: without it no call can authenticate.
func ModeOf(auth ClientAuth, haveCA, seen bool) (Mode, string) {
	switch {
	case auth == ClientAuthStrict:
		return ModeStrict, ReasonStrictByFlag
	case seen:
		return ModeStrict, ReasonAuthenticatedCallSeen
	case !haveCA:
		return ModePermissive, ReasonNoClientCA
	}
	return ModePermissive, ReasonNoAuthenticatedCallSeen
}

// ModeCondition is the LifeboatConfig's EvictionWebhookStrict condition for the mode, its message
// saying what the mode lets a forged review do and what would change it.
func ModeCondition(auth ClientAuth, haveCA bool, seen *metav1.Time) metav1.Condition {
	mode, reason := ModeOf(auth, haveCA, seen != nil)
	c := metav1.Condition{Type: v1alpha1.ConfigConditionEvictionWebhookStrict, Status: metav1.ConditionTrue, Reason: reason}
	switch reason {
	case ReasonStrictByFlag:
		c.Message = "--webhook-client-auth=strict: the webhook acts only for callers presenting the API server's client certificate"
	case ReasonAuthenticatedCallSeen:
		c.Message = fmt.Sprintf("the API server presented its client certificate at %s: from then on the webhook acts only for callers presenting it, on every replica", seen.UTC().Format(time.RFC3339))
	case ReasonNoClientCA:
		c.Message = "no --webhook-client-ca: the webhook cannot authenticate the API server and acts on every review within its bounds (a live migration at most, once per VMI per spec.evictionWebhook.unauthenticatedMigrationInterval unless its node is cordoned); docs/operations.md"
	default:
		c.Message = "the API server has not presented a client certificate that --webhook-client-ca verifies: the webhook acts on reviews it cannot authenticate within its bounds (a live migration at most, once per VMI per spec.evictionWebhook.unauthenticatedMigrationInterval unless its node is cordoned); give the API server a client certificate to make it strict (docs/operations.md)"
	}
	if mode == ModePermissive {
		c.Status = metav1.ConditionFalse
	}
	return c
}

// Unauthenticated narrows the decision on a review the webhook cannot authenticate (permissive
// mode) to what a forger may be allowed to cause: the mark of a VM whose strategy asks for a live
// migration, no more than once per interval unless its node is cordoned (a drain cordons first).
// A mark from the webhook carries no deadline, so its migration never pauses the guest; External
// is left out because its mark asks an outside controller to stop the VM. Answers that change
// nothing pass unchanged. now and the VMI's history decide; nothing is read here.
func Unauthenticated(d Decision, vmi *v1alpha1.VirtualMachineInstance, strategy v1alpha1.EvictionStrategy, cordoned bool, interval time.Duration, now time.Time) Decision {
	if d.Answer != AnswerEvacuating {
		return d
	}
	key := vmi.Namespace + "/" + vmi.Name
	switch strategy {
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
	default:
		return Decision{Answer: AnswerBounded, Message: fmt.Sprintf(
			"VMI %q has eviction strategy %s: the eviction webhook marks it only for the API server presenting its client certificate, which this review did not (docs/operations.md)", key, strategy)}
	}
	if cordoned {
		return d
	}
	if last := lastEvacuation(vmi); !last.IsZero() && now.Sub(last) < interval {
		return Decision{Answer: AnswerBounded, Message: fmt.Sprintf(
			"VMI %q last left or was asked to leave a node at %s: an eviction the webhook cannot authenticate moves a VM at most once every %s unless its node %s is cordoned (kubectl drain cordons it; docs/operations.md)",
			key, last.UTC().Format(time.RFC3339), interval, vmi.Status.NodeName)}
	}
	return d
}

// lastEvacuation is the latest of the VMI's mark (or the mark's end) and its last migration's
// start and end; zero if it has none.
func lastEvacuation(vmi *v1alpha1.VirtualMachineInstance) time.Time {
	var last time.Time
	later := func(t *metav1.Time) {
		if t != nil && t.After(last) {
			last = t.Time
		}
	}
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); c != nil {
		later(&c.LastTransitionTime)
	}
	if m := vmi.Status.MigrationState; m != nil {
		later(m.StartTimestamp)
		later(m.EndTimestamp)
	}
	return last
}
