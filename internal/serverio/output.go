package serverio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// FilePublisher writes the served-set document (the values.yaml of contract
// §6) to a file, atomically, so that a reader never sees half of it. The
// file can be passed as is to `osimages render -f`. It is world-readable,
// like any values file: it names images, nothing secret.
//
// Beside it, at OCIPath(Path), it writes the served-oci.yaml document (the
// OCI reference of each available image), which the ConfigMap holds under
// its own key: the values file stays the values document alone, as Sylva
// reads it, and a file-mode user gets the references all the same.
type FilePublisher struct{ Path string }

// OCIPath is the file beside the served-set file path that holds the OCI
// references: "-oci" before the extension (served.yaml: served-oci.yaml, as
// the ConfigMap's key).
func OCIPath(path string) string {
	ext := filepath.Ext(path)
	if ext == "" {
		ext = ".yaml"
	}
	return strings.TrimSuffix(path, filepath.Ext(path)) + "-oci" + ext
}

// Publish implements Publisher. The filenames are not written: the file is
// a values document, and only the fleet check, which reads the ConfigMap,
// needs them. A set that a ConfigMap could not hold is refused all the
// same, since Sylva's consumers read it from one. Both files are written
// to temporary files first, so that a fault (a missing directory, a full
// disk) leaves both as they were; the OCI references then replace theirs
// right after the values file.
func (p FilePublisher) Publish(_ context.Context, out osimage.ServedOutput) error {
	data, err := out.ConfigMapData("the served set")
	if err != nil {
		return err
	}
	values, err := tempFile(p.Path, data[osimage.ValuesKey])
	if err != nil {
		return err
	}
	defer os.Remove(values)
	ociPath := OCIPath(p.Path)
	oci, err := tempFile(ociPath, data[osimage.ServedOCIKey])
	if err != nil {
		return err
	}
	defer os.Remove(oci)
	if err := os.Rename(values, p.Path); err != nil {
		return fmt.Errorf("writing %s: %w", p.Path, err)
	}
	if err := os.Rename(oci, ociPath); err != nil {
		return fmt.Errorf("writing %s: %w", ociPath, err)
	}
	return nil
}

// tempFile writes data, world-readable, to a new temporary file beside
// path, to be renamed over it; errors name path.
func tempFile(path, data string) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	_, err = tmp.WriteString(data)
	if err == nil {
		// CreateTemp makes the file 0600; the umask does not apply to
		// Chmod.
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return tmp.Name(), nil
}

// Published implements PublishedReader: the set in the file, empty when
// there is no file yet. Anything but a regular file there (a FIFO would
// block the read until someone writes it) is an error, and so is a file
// larger than a ConfigMap could hold, which Publish never writes.
func (p FilePublisher) Published(context.Context) (osimage.ServedSet, error) {
	f, err := os.OpenFile(p.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return osimage.ServedSet{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file but %s: remove it, and the server writes the served set there again", p.Path, fileKind(fi.Mode()))
	}
	doc, err := io.ReadAll(io.LimitReader(f, osimage.MaxConfigMapBytes+1))
	if err != nil {
		return nil, err
	}
	if len(doc) > osimage.MaxConfigMapBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes, which the server never writes: remove it, and the server writes the served set there again", p.Path, osimage.MaxConfigMapBytes)
	}
	s, err := osimage.ParseServed(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Path, err)
	}
	return s, nil
}

// ConfigMapPublisher applies the served-images ConfigMap with server-side
// apply: values.yaml (contract §6) and, beside it, served-filenames.yaml.
type ConfigMapPublisher struct {
	Client kube.Client
	Key    kube.ObjectKey
}

// Publish implements Publisher. Data too large for a ConfigMap is refused
// here, naming its size and image count, rather than by the apiserver.
func (p ConfigMapPublisher) Publish(ctx context.Context, out osimage.ServedOutput) error {
	data, err := out.ConfigMapData("ConfigMap " + p.Key.String())
	if err != nil {
		return err
	}
	_, err = kube.ApplyConfigMap(ctx, p.Client, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: p.Key.Name, Namespace: p.Key.Namespace},
		Data:       data,
	})
	if apierrors.IsForbidden(err) {
		if cm, gerr := kube.GetConfigMap(ctx, p.Client, p.Key); gerr == nil && cm == nil {
			return fmt.Errorf("%w: the ConfigMap does not exist (deleted?) and this server may not create it: the chart creates it and grants no create, which RBAC cannot bind to one name; helm upgrade creates it again, empty, and the server fills it at once (or set outputConfigMap.create: false to let the server create it)", err)
		}
	}
	return err
}

// WatchOutput implements OutputWatcher with an informer on the ConfigMap:
// a deletion or an edit by hand is seen at once, and the informer's resync
// tells again what its cache holds every minute.
func (p ConfigMapPublisher) WatchOutput(ctx context.Context, observed func(data map[string]string, exists bool)) error {
	informer := configMapInformer(p.Client, p.Key, time.Minute)
	tell := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			observed(cm.Data, true)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    tell,
		UpdateFunc: func(_, obj any) { tell(obj) },
		DeleteFunc: func(any) { observed(nil, false) },
	}); err != nil {
		return fmt.Errorf("watching ConfigMap %s: %w", p.Key, err)
	}
	informer.RunWithContext(ctx)
	return nil
}

// Published implements PublishedReader: the set in the ConfigMap, empty
// when it is absent or has no values.yaml yet (the chart creates it empty).
func (p ConfigMapPublisher) Published(ctx context.Context) (osimage.ServedSet, error) {
	cm, err := kube.GetConfigMap(ctx, p.Client, p.Key)
	if err != nil {
		return nil, err
	}
	if cm == nil || cm.Data[osimage.ValuesKey] == "" {
		return osimage.ServedSet{}, nil
	}
	s, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey]))
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s: %w", p.Key, err)
	}
	return s, nil
}

// fileKind names what a file that is not a regular one is.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file (" + m.Type().String() + ")"
}
