// Kyverno v1.19.1, the baseline of the propagation benchmark
// (hack/bench-propagation.sh). It is a module of its own because Kyverno's
// go.mod replaces k8s.io/pod-security-admission with its fork, and pins
// k8s.io at versions the product must not be tied to.
module github.com/sylva-projects/osimages/hack/tools/kyverno

go 1.26.0

replace k8s.io/pod-security-admission => github.com/kyverno/pod-security-admission v0.0.0-20251031094455-46f20778634f
