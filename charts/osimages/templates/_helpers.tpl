{{/* Names: the release name (or fullnameOverride), cut to fit the longest suffix. */}}
{{- define "osimages.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "osimages.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "server"). */}}
{{- define "osimages.selectorLabels" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "osimages.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "osimages.outputNamespace" -}}
{{ default .Release.Namespace .Values.outputConfigMap.namespace }}
{{- end -}}

{{- /* "true" when the server may create its output ConfigMap, bound to that
one name by the create guard (a ValidatingAdmissionPolicy, delete-guard.yaml):
RBAC cannot restrict create to a name. It then restores its output deleted by
hand within seconds. */}}
{{- define "osimages.serverCreateGuard" -}}
{{- if and .Values.server.enabled .Values.outputConfigMap.create .Values.deleteGuard.enabled (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end -}}

{{- define "osimages.infoNamespace" -}}
{{ default .Release.Namespace .Values.osImagesInfoConfigMap.namespace }}
{{- end -}}

{{- define "osimages.catalogNamespace" -}}
{{ default (include "osimages.infoNamespace" .) .Values.catalogJob.namespace }}
{{- end -}}

{{/* The propagation rules: Sylva's, from outputConfigMap, then extraRules. */}}
{{- define "osimages.rules" -}}
rules:
- name: os-image-server-images
  source: {{ include "osimages.outputNamespace" . }}/{{ .Values.outputConfigMap.name }}
  target: {{ .Values.propagation.target }}
  namespaceSelector:
    {{- toYaml .Values.propagation.namespaceSelector | nindent 4 }}
{{- with .Values.propagation.catalog }}
  catalog: {{ . }}
{{- end }}
{{- with .Values.propagation.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The names the propagation may write: every rule's target. */}}
{{- define "osimages.ruleTargets" -}}
{{- $targets := list .Values.propagation.target -}}
{{- range .Values.propagation.extraRules -}}
{{- $targets = append $targets .target -}}
{{- end -}}
{{- toJson ($targets | uniq) -}}
{{- end -}}

{{/* Environment for the components that talk to registries. */}}
{{- define "osimages.proxyEnv" -}}
{{- with .Values.proxies.http_proxy }}
- {name: HTTP_PROXY, value: {{ . | quote }}}
{{- end }}
{{- with .Values.proxies.https_proxy }}
- {name: HTTPS_PROXY, value: {{ . | quote }}}
{{- end }}
{{- with .Values.proxies.no_proxy }}
- {name: NO_PROXY, value: {{ . | quote }}}
{{- end }}
{{- end -}}

{{/* Registry flags, volumes and mounts, shared by server, controller and catalog. */}}
{{- define "osimages.registryArgs" -}}
{{- if .Values.oci_registry_extra_ca_certs }}
- --ca-file=/etc/osimages/ca/ca.crt
{{- end }}
{{- if .Values.registryCredentialsSecret }}
- --registry-config=/etc/osimages/registry/config.json
{{- end }}
{{- end -}}

{{- define "osimages.registryMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if .Values.oci_registry_extra_ca_certs }}
- {name: registry-ca, mountPath: /etc/osimages/ca, readOnly: true}
{{- end }}
{{- if .Values.registryCredentialsSecret }}
- {name: registry-credentials, mountPath: /etc/osimages/registry, readOnly: true}
{{- end }}
{{- end -}}

{{- define "osimages.registryVolumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- if .Values.oci_registry_extra_ca_certs }}
- name: registry-ca
  configMap:
    name: {{ include "osimages.fullname" . }}-registry-ca
{{- end }}
{{- if .Values.registryCredentialsSecret }}
- name: registry-credentials
  secret:
    secretName: {{ .Values.registryCredentialsSecret }}
    items:
    - {key: .dockerconfigjson, path: config.json}
{{- end }}
{{- end -}}

{{- define "osimages.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Cross-field checks that a JSON schema cannot say clearly. */}}
{{- define "osimages.validate" -}}
{{- if and .Values.controller.enabled .Values.controller.propagate .Values.propagation.enabled -}}
{{- fail "controller.propagate and propagation.enabled are both true: the controller already propagates; set propagation.enabled=false (or controller.propagate=false)" -}}
{{- end -}}
{{- if and .Values.catalogJob.enabled (ne .Values.osImagesInfoConfigMap.name "os-images-info") -}}
{{- fail (printf "catalogJob.enabled is true but osImagesInfoConfigMap.name is %q: the catalog always writes os-images-info (contract §3)" .Values.osImagesInfoConfigMap.name) -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ingress.host) -}}
{{- fail "ingress.enabled is true but ingress.host is empty: set it to the name booting hosts download images from (Sylva: external_hostnames.os_image_server)" -}}
{{- end -}}
{{- if and .Values.ingress.tls.enabled (not .Values.ingress.tls.secretName) -}}
{{- fail "ingress.tls.enabled is true but ingress.tls.secretName is empty" -}}
{{- end -}}
{{- $maxUnavailable := .Values.server.pdb.maxUnavailable -}}
{{- if eq (int (trimSuffix "%" (toString $maxUnavailable))) 0 -}}
{{- fail (printf "server.pdb.maxUnavailable is %v: the server's PodDisruptionBudget would allow no eviction and block every node drain; set it to 1 or more (or a percentage above 0%%)" $maxUnavailable) -}}
{{- end -}}
{{- $c := .Values.controller -}}
{{- if and $c.enabled (gt (int $c.replicas) 1) -}}
{{- $min := dig "pdb" "minAvailable" 1 $c -}}
{{- $pods := 0 -}}
{{- if kindIs "string" $min -}}
{{- /* Kubernetes rounds a percentage of minAvailable up. */ -}}
{{- $pods = div (add (mul (int (trimSuffix "%" $min)) (int $c.replicas)) 99) 100 -}}
{{- else -}}
{{- $pods = int $min -}}
{{- end -}}
{{- if ge (int $pods) (int $c.replicas) -}}
{{- fail (printf "controller.pdb.minAvailable is %v, which keeps all %d controller.replicas running: the PodDisruptionBudget would allow no eviction and block every node drain; set it below controller.replicas (such as %d)" $min (int $c.replicas) (sub (int $c.replicas) 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The catalog Job's spec: (dict "root" $ "name" NAME "ns" NAMESPACE). Kept
apart so that the Job's name can hash exactly what it renders. */}}
{{- define "osimages.catalogJobSpec" -}}
{{- $root := .root -}}
backoffLimit: {{ $root.Values.catalogJob.backoffLimit }}
ttlSecondsAfterFinished: {{ $root.Values.catalogJob.ttlSecondsAfterFinished }}
template:
  metadata:
    labels:
      {{- include "osimages.selectorLabels" (dict "root" $root "component" "catalog") | nindent 6 }}
  spec:
    serviceAccountName: {{ .name }}
    restartPolicy: Never
    {{- include "osimages.podSpecCommon" $root | nindent 4 }}
    containers:
    - name: catalog
      image: {{ include "osimages.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args:
      - catalog
      - --values=/etc/osimages/catalog/values.yaml
      - --apply
      - --namespace={{ .ns }}
      {{- include "osimages.registryArgs" $root | nindent 6 }}
      env:
      {{- include "osimages.proxyEnv" $root | nindent 6 }}
      resources:
        {{- toYaml $root.Values.catalogJob.resources | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
      - {name: values, mountPath: /etc/osimages/catalog, readOnly: true}
      {{- include "osimages.registryMounts" $root | nindent 6 }}
    volumes:
    - name: values
      configMap:
        name: {{ .name }}-values
    {{- include "osimages.registryVolumes" $root | nindent 4 }}
{{- end -}}

{{/* The bytes of a Kubernetes quantity, as a decimal string ("" when it
cannot be read), so that 30Gi and 30720Mi compare equal, as the apiserver
compares them. */}}
{{- define "osimages.quantityBytes" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $units := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $unit := trimPrefix $number $q -}}
{{- if and $number (hasKey $units $unit) -}}
{{- printf "%.0f" (mulf (float64 $number) (get $units $unit)) -}}
{{- end -}}
{{- end -}}

{{/* A StatefulSet's volumeClaimTemplates cannot change: an upgrade that
changes the data volume (osImagePersistenceDefaults) would fail half-way,
as "field is immutable", and leave a failed revision. It is refused here,
before anything is applied, with the steps that make the change
(README: "Changing the data volume"). lookup finds nothing under helm
template and a client-side dry run: then there is nothing to compare. */}}
{{- define "osimages.checkDataVolume" -}}
{{- $name := printf "%s-server" (include "osimages.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- $sts := lookup "apps/v1" "StatefulSet" $ns $name -}}
{{- $old := dict -}}
{{- range (dig "spec" "volumeClaimTemplates" list ($sts | default dict)) -}}
{{- if eq (dig "metadata" "name" "" .) "data" -}}{{- $old = . -}}{{- end -}}
{{- end -}}
{{- if $old -}}
{{- $p := .Values.osImagePersistenceDefaults -}}
{{- $changes := list -}}
{{- $oldSize := toString (dig "spec" "resources" "requests" "storage" "" $old) -}}
{{- if ne (include "osimages.quantityBytes" $oldSize) (include "osimages.quantityBytes" $p.size) -}}
{{- $changes = append $changes (printf "size %s -> %s" $oldSize (toString $p.size)) -}}
{{- end -}}
{{- $oldClass := dig "spec" "storageClassName" "" $old -}}
{{- if ne $oldClass (toString $p.storageClass) -}}
{{- $changes = append $changes (printf "storageClass %q -> %q" $oldClass (toString $p.storageClass)) -}}
{{- end -}}
{{- $oldModes := dig "spec" "accessModes" list $old -}}
{{- if ne (toJson $oldModes) (toJson $p.accessModes) -}}
{{- $changes = append $changes (printf "accessModes %s -> %s" (toJson $oldModes) (toJson $p.accessModes)) -}}
{{- end -}}
{{- if $changes -}}
{{- fail (printf `osImagePersistenceDefaults changes the data volume of StatefulSet %s/%s (%s), and Kubernetes cannot change a StatefulSet's volumeClaimTemplates: this upgrade is refused, nothing was changed. Keep the old values, or change the volumes first, as charts/osimages/README.md says ("Changing the data volume"): (1) a larger size, with a storage class that allows expansion: for each replica N, kubectl -n %s patch pvc data-%s-N -p '{"spec":{"resources":{"requests":{"storage":"%s"}}}}'; (2) kubectl -n %s delete statefulset %s --cascade=orphan (the pods keep serving); (3) helm upgrade again with the new values; (4) another storage class or access mode, or a smaller size: after (2) and (3), replica by replica, kubectl -n %s delete pvc data-%s-N --wait=false and kubectl -n %s delete pod %s-N: the replica comes back on a new volume and fills it from its peers or the registries.`
  $ns $name (join ", " $changes) $ns $name (toString $p.size) $ns $name $ns $name $ns $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
