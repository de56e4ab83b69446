# Sourced by scripts that make images (scripts/kube/node.sh,
# scripts/registry.sh).
#
# docker_save NAME CONFIG-JSON OUT LAYER... writes an image as `docker
# save` writes it, which `ctr images import`, `skopeo copy docker-archive:`
# and `vivarium image import` read: manifest.json names the config and
# the layers (uncompressed tars), the config lists the layers' sha256
# (diff_ids). CONFIG-JSON is the "config" object (Entrypoint, Env ...).
# OUT appears last, when complete.
docker_save() {
	_ds_name=$1 _ds_cfg=$2 _ds_dest=$3 # sh has no locals: no name of the caller's
	shift 3
	_ds_img=$(mktemp -d "$(dirname "$_ds_dest")/image.XXXXXX")
	_ds_ids="" _ds_layers=""
	_ds_i=0
	for _ds_l in "$@"; do
		_ds_i=$((_ds_i + 1))
		ln "$_ds_l" "$_ds_img/layer$_ds_i.tar" 2>/dev/null || cp "$_ds_l" "$_ds_img/layer$_ds_i.tar"
		_ds_ids="$_ds_ids${_ds_ids:+,}\"sha256:$(sha256sum < "$_ds_l" | cut -d' ' -f1)\""
		_ds_layers="$_ds_layers${_ds_layers:+,}\"layer$_ds_i.tar\""
	done
	printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":[%s]}}' "$_ds_cfg" "$_ds_ids" > "$_ds_img/config.json"
	_ds_c=$(sha256sum < "$_ds_img/config.json" | cut -d' ' -f1)
	mv "$_ds_img/config.json" "$_ds_img/$_ds_c.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":[%s]}]' "$_ds_c" "$_ds_name" "$_ds_layers" > "$_ds_img/manifest.json"
	(cd "$_ds_img" && tar --owner=0 --group=0 -cf "$_ds_dest.tmp" manifest.json "$_ds_c.json" $(echo "$_ds_layers" | tr -d '"' | tr ',' ' '))
	rm -rf "$_ds_img"
	mv "$_ds_dest.tmp" "$_ds_dest"
}
