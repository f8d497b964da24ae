{{/* RBAC and workload shared by the propagation Deployment and the fleet
controller: (dict "root" $ "component" "propagate" "leaseName" NAME
"writableNames" LIST "deletableNames" LIST "metal3" BOOL "ownConfigMaps" LIST,
names it updates in the release namespace only). */}}
{{- define "osimages.controllerRBAC" -}}
{{- $root := .root }}
{{- $name := printf "%s-%s" (include "osimages.fullname" $root) .component }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
---
{{- /* Cluster-wide, because workload-cluster namespaces come and go:
- read namespaces and ConfigMaps (one informer each);
- update and patch only ConfigMaps of the names it manages (resourceNames);
- delete only ConfigMaps named as a propagation target: osimages never
  deletes a catalog or a status. RBAC cannot restrict a ClusterRole to
  namespaces, so the delete guard (a ValidatingAdmissionPolicy) refuses the
  delete of any such ConfigMap that osimages did not make;
- create ConfigMaps: RBAC cannot restrict create to a name, so this one verb
  is not limited to the managed names (the code creates nothing else);
- record events (core and events.k8s.io). */}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name }}-{{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
rules:
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: {{ toJson .writableNames }}
  verbs: [update, patch]
{{- /* An empty resourceNames would allow every name. */}}
{{- with .deletableNames }}
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: {{ toJson . }}
  verbs: [delete]
{{- end }}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .metal3 }}
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [metal3machinetemplates, metal3machines]
  verbs: [get, list, watch]
{{- /* The check reads whether the installed CAPM3 accepts oci:// images. */}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  resourceNames: [metal3machinetemplates.infrastructure.cluster.x-k8s.io]
  verbs: [get]
{{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}-{{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name }}-{{ $root.Release.Namespace }}
subjects:
- kind: ServiceAccount
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
---
{{- /* Leader election: its own Lease, in the release namespace only. */}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}-leader-election
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ .leaseName | quote }}]
  verbs: [get, update, patch]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
{{- /* ConfigMaps it writes in the release namespace only (the fleet's
needs); create is granted cluster-wide above. */}}
{{- with .ownConfigMaps }}
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: {{ toJson . }}
  verbs: [update, patch]
{{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}-leader-election
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $name }}-leader-election
subjects:
- kind: ServiceAccount
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
{{- end -}}

{{/* (dict "root" $ "component" C "values" V "args" LIST "registry" BOOL "rules" BOOL
"catalogRegistries" YAML: the values mounted at /etc/osimages/catalog-registries, "" for none) */}}
{{- define "osimages.controllerWorkload" -}}
{{- $root := .root }}
{{- $catalogRegistries := get . "catalogRegistries" }}
{{- $v := .values }}
{{- $name := printf "%s-%s" (include "osimages.fullname" $root) .component }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ $v.replicas }}
  selector:
    matchLabels:
      {{- include "osimages.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "osimages.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .component }}
      {{- if or .rules $catalogRegistries }}
      annotations:
        {{- if .rules }}
        checksum/rules: {{ include "osimages.rules" $root | sha256sum }}
        {{- end }}
        {{- with $catalogRegistries }}
        checksum/catalog-registries: {{ . | sha256sum }}
        {{- end }}
      {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      {{- include "osimages.podSpecCommon" $root | nindent 6 }}
      containers:
      - name: {{ .component }}
        image: {{ include "osimages.image" $root }}
        imagePullPolicy: {{ $root.Values.image.pullPolicy }}
        args:
        {{- toYaml .args | nindent 8 }}
        - --leader-elect
        - --leader-election-namespace={{ $root.Release.Namespace }}
        - --metrics-addr=:8080
        - --health-addr=:8081
        - --log-format={{ $root.Values.logFormat }}
        {{- if .rules }}
        - --config=/etc/osimages/rules/rules.yaml
        {{- end }}
        {{- if .registry }}
        {{- include "osimages.registryArgs" $root | nindent 8 }}
        {{- end }}
        env:
        {{- if .registry }}
        {{- include "osimages.proxyEnv" $root | nindent 8 }}
        {{- end }}
        ports:
        - {name: metrics, containerPort: 8080, protocol: TCP}
        - {name: health, containerPort: 8081, protocol: TCP}
        readinessProbe:
          httpGet: {path: /readyz, port: health}
          periodSeconds: 5
        livenessProbe:
          httpGet: {path: /healthz, port: health}
          periodSeconds: 20
        resources:
          {{- toYaml $v.resources | nindent 10 }}
        securityContext:
          {{- toYaml $root.Values.securityContext | nindent 10 }}
        volumeMounts:
        {{- if .rules }}
        - {name: rules, mountPath: /etc/osimages/rules, readOnly: true}
        {{- end }}
        {{- if $catalogRegistries }}
        - {name: catalog-registries, mountPath: /etc/osimages/catalog-registries, readOnly: true}
        {{- end }}
        {{- include "osimages.registryMounts" $root | nindent 8 }}
      volumes:
      {{- if .rules }}
      - name: rules
        configMap:
          name: {{ include "osimages.fullname" $root }}-rules
      {{- end }}
      {{- if $catalogRegistries }}
      - name: catalog-registries
        configMap:
          name: {{ include "osimages.fullname" $root }}-catalog-registries
      {{- end }}
      {{- include "osimages.registryVolumes" $root | nindent 6 }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $v.affinity }}
        {{- toYaml $v.affinity | nindent 8 }}
        {{- else }}
        # Replicas on different nodes, so that a node drain keeps a leader
        # candidate running.
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector:
                matchLabels:
                  {{- include "osimages.selectorLabels" (dict "root" $root "component" .component) | nindent 18 }}
        {{- end }}
{{- if gt (int $v.replicas) 1 }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "osimages.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  minAvailable: {{ dig "pdb" "minAvailable" 1 $v }}
  selector:
    matchLabels:
      {{- include "osimages.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
{{- end }}
{{- end -}}
