{{/* The alerting rules, as a Prometheus rule file (the PrometheusRule's
spec), so that Prometheus's own parser checks them in the chart tests. Every
expression reads metrics that osimages exports (README, "Monitoring"). */}}
{{- define "osimages.alerts" -}}
{{- $r := .Values.monitoring.prometheusRule -}}
groups:
- name: osimages
  rules:
  - alert: OSImagesClusterImageNotServed
    expr: max by (namespace) (osimages_cluster_images_unserved{state="not-served"}) > 0
    for: {{ $r.for.imageNotServed }}
    labels:
      severity: critical
    annotations:
      summary: A workload cluster uses an OS image that the management cluster does not serve.
      description: >-
        {{`{{ $value }}`}} image(s) used or picked in namespace {{`{{ $labels.namespace }}`}}
        are not in the served set: rendering its templates fails with "is currently not
        served by mgmt cluster os-image-server". ConfigMap osimages-status in that namespace
        names each image and what needs it.
  - alert: OSImagesClusterImageNotAvailable
    expr: max by (namespace) (osimages_cluster_images_unserved{state="not-available"}) > 0
    for: {{ $r.for.imageNotAvailable }}
    labels:
      severity: warning
    annotations:
      summary: A workload cluster waits for an OS image that the management cluster has not made available.
      description: >-
        {{`{{ $value }}`}} image(s) needed in namespace {{`{{ $labels.namespace }}`}} are
        selected but still not downloaded and verified. The image server's status page says
        why (downloading, or failed with the reason).
  - alert: OSImagesDownloadFailing
    expr: max by (namespace, pod) (osimages_images{phase="failed", selected="true"}) > 0
    for: {{ $r.for.downloadFailing }}
    labels:
      severity: warning
    annotations:
      summary: Selected OS images keep failing to download or verify.
      description: >-
        {{`{{ $value }}`}} selected image(s) on {{`{{ $labels.pod }}`}} are failed (the server
        retries with backoff). Its status page and its log name each image and the cause
        (registry, signature, digest, size or free space).
  - alert: OSImagesDataVolumeNearlyFull
    expr: >-
      max by (namespace, pod) (osimages_disk_free_bytes
      / (osimages_disk_free_bytes + osimages_storage_used_bytes)) < {{ $r.diskFreeRatio }}
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: The image server's data volume is nearly full.
      description: >-
        Less than {{ mulf $r.diskFreeRatio 100 }}% of the data volume of {{`{{ $labels.pod }}`}}
        is free: new images will fail with a free-space error. Grow the volume
        (osImagePersistenceDefaults.size) or deselect images.
  - alert: OSImagesPropagationLagging
    expr: max by (namespace, rule) (osimages_propagate_copies{state="out_of_sync"}) > 0
    for: {{ $r.for.propagationLagging }}
    labels:
      severity: warning
    annotations:
      summary: Copies of the served set are not in sync with their source.
      description: >-
        {{`{{ $value }}`}} copies of rule {{`{{ $labels.rule }}`}} stay out of sync: workload
        clusters render against an old served set. See the controller's log and the events
        of the copies.
  - alert: OSImagesPropagationSourceMissing
    expr: max by (namespace, rule) (osimages_propagate_source_present) == 0
    for: {{ $r.for.propagationLagging }}
    labels:
      severity: warning
    annotations:
      summary: The source ConfigMap of a propagation rule is missing.
      description: >-
        The source of rule {{`{{ $labels.rule }}`}} does not exist: the copies are kept as
        they are and marked stale.
  - alert: OSImagesCatalogFailing
    expr: >-
      max by (namespace) (increase(osimages_catalog_runs_total{result="failed"}[1h])) > 0
      unless on (namespace)
      max by (namespace) (increase(osimages_catalog_runs_total{result="published"}[1h])) > 0
    for: {{ $r.for.catalogFailing }}
    labels:
      severity: warning
    annotations:
      summary: The catalog of a namespace keeps failing.
      description: >-
        os-images-info of namespace {{`{{ $labels.namespace }}`}} could not be published in
        the last hour (the last good one stays). The CatalogFailed or CatalogValuesInvalid
        events on its catalog-values ConfigMap name the images and causes.
  - alert: OSImagesServerWaitingForCatalog
    expr: max by (namespace, pod) (osimages_server_phase{phase="waiting-for-catalog"}) == 1
    for: {{ $r.for.catalogFailing }}
    labels:
      severity: warning
    annotations:
      summary: The image server has no catalog to serve from.
      description: >-
        {{`{{ $labels.pod }}`}} waits for its os-images-info ConfigMap to be filled (by the
        catalog Job, the controller or Sylva's os-images-info unit): check that Job's
        logs. Images already stored are kept meanwhile.
{{- end -}}
