// Command chart installs charts/osimages into the e2e cluster for Metal3 in
// a box (hack/e2e-metal3.sh) the way an operator does: `helm install -f
// values.yaml` through Helm's own library, waiting as `helm install
// --wait=watcher --wait-for-jobs` does (the catalog Job complete, the
// server's StatefulSet rolled out). Before it, the release namespace is
// made with PodSecurity `restricted` enforced, as the e2e scenarios run
// the chart, and the server's TLS Secret is made from the run's
// certificate (server.tlsSecret names it in the values). With -upgrade it
// is `helm upgrade -f values.yaml -f more.yaml` of the release installed,
// waiting alike: a management-side change, as an operator makes it.
//
//	chart -kubeconfig K -chart charts/osimages -namespace sylva-system \
//	  -tls-secret osimages-m3box-tls -tls-cert server.crt -tls-key server.key \
//	  -f values.yaml [-f more.yaml]
//	chart -kubeconfig K -chart charts/osimages -namespace sylva-system -upgrade \
//	  -f values.yaml -f more.yaml
//
// It runs inside the e2e cluster's network namespace (hack/e2e-cluster.sh
// exec): the apiserver's address exists nowhere else.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// files is a repeatable -f flag, as helm's.
type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "the cluster's admin kubeconfig")
	chartDir := flag.String("chart", "charts/osimages", "the chart's folder")
	release := flag.String("release", "osimages", "the release name")
	ns := flag.String("namespace", "sylva-system", "the release namespace (made when missing)")
	tlsSecret := flag.String("tls-secret", "", "a kubernetes.io/tls Secret to make in the namespace from -tls-cert and -tls-key")
	tlsCert := flag.String("tls-cert", "", "PEM certificate (chain) of the Secret")
	tlsKey := flag.String("tls-key", "", "PEM key of the Secret")
	timeout := flag.Duration("timeout", 8*time.Minute, "bound on the install, its waits included")
	upgrade := flag.Bool("upgrade", false, "upgrade the release installed to the chart with these values (helm upgrade -f), instead of installing it")
	var valueFiles files
	flag.Var(&valueFiles, "f", "a values file (repeatable; later ones win, as helm -f)")
	flag.Parse()
	if *kubeconfig == "" || len(valueFiles) == 0 || (*tlsSecret != "" && (*tlsCert == "" || *tlsKey == "")) || (*upgrade && *tlsSecret != "") {
		fmt.Fprintln(os.Stderr, "chart: -kubeconfig (or KUBECONFIG) and -f are required; -tls-secret needs -tls-cert and -tls-key, and is made at the install, not with -upgrade")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	verb, run := "install", func() (*releasev1.Release, error) {
		return install(ctx, *kubeconfig, *chartDir, *release, *ns, *tlsSecret, *tlsCert, *tlsKey, valueFiles)
	}
	if *upgrade {
		verb, run = "upgrade", func() (*releasev1.Release, error) {
			return upgradeRelease(ctx, *kubeconfig, *chartDir, *release, *ns, valueFiles)
		}
	}
	rel, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
	fmt.Printf("helm %s %s: revision %d %s in namespace %s\n", verb, rel.Name, rel.Version, rel.Info.Status, rel.Namespace)
}

func install(ctx context.Context, kubeconfig, chartDir, release, ns, tlsSecret, tlsCert, tlsKey string, valueFiles []string) (*releasev1.Release, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig %s: %w", kubeconfig, err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// The chart's pods must meet PodSecurity's restricted profile, as in
	// the e2e scenarios: the apiserver enforces it on this namespace.
	_, err = kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("making namespace %s: %w", ns, err)
	}
	if tlsSecret != "" {
		crt, err := os.ReadFile(tlsCert)
		if err != nil {
			return nil, err
		}
		key, err := os.ReadFile(tlsKey)
		if err != nil {
			return nil, err
		}
		_, err = kc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: tlsSecret, Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("making the TLS Secret %s/%s: %w", ns, tlsSecret, err)
		}
	}

	ac, ch, vals, err := load(kubeconfig, chartDir, ns, valueFiles)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(ac)
	in.ReleaseName, in.Namespace = release, ns
	deadline, _ := ctx.Deadline()
	in.WaitStrategy, in.WaitForJobs, in.Timeout = kube.StatusWatcherStrategy, true, time.Until(deadline)
	r, err := in.RunWithContext(ctx, ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm install %s (chart %s): %w", release, chartDir, err)
	}
	return asRelease(r)
}

// upgradeRelease is helm upgrade -f of each values file: the values the
// release was installed with are not reused, as helm upgrade does.
func upgradeRelease(ctx context.Context, kubeconfig, chartDir, release, ns string, valueFiles []string) (*releasev1.Release, error) {
	ac, ch, vals, err := load(kubeconfig, chartDir, ns, valueFiles)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(ac)
	up.Namespace = ns
	deadline, _ := ctx.Deadline()
	up.WaitStrategy, up.WaitForJobs, up.Timeout = kube.StatusWatcherStrategy, true, time.Until(deadline)
	r, err := up.RunWithContext(ctx, release, ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm upgrade %s (chart %s): %w", release, chartDir, err)
	}
	return asRelease(r)
}

// load reads the values files (later ones win, as helm -f) and the chart,
// and sets up Helm's client of the release namespace.
func load(kubeconfig, chartDir, ns string, valueFiles []string) (*action.Configuration, *chartv2.Chart, map[string]any, error) {
	vals, err := (&values.Options{ValueFiles: valueFiles}).MergeValues(getter.Providers{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the values %v: %w", valueFiles, err)
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading the chart %s: %w", chartDir, err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &ns
	ac := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	if err := ac.Init(flags, ns, "secret"); err != nil {
		return nil, nil, nil, err
	}
	return ac, ch, vals, nil
}

func asRelease(r any) (*releasev1.Release, error) {
	rel, ok := r.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("helm returned a %T, not a release", r)
	}
	return rel, nil
}
