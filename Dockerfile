# GPUFlex in a container: a node (`gpuflex node start`) or the portal (`gpuflex web`).
#
#   docker build -t gpuflex .                      # CPU torch (the default)
#   docker build -t gpuflex:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   docker compose up                              # three nodes and the portal, see compose.yaml
#
# torch is pinned like `just setup` pins it and installed first, from TORCH_INDEX; GPUFlex is then
# installed under a constraint on that torch, so no extra can replace it with another build.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_SPEC=torch==2.13.0
# The CPU build; a CUDA index (.../whl/cu128, or .../whl/cu118 with torch==2.7.1 for Pascal cards)
# gives a GPU image. Run it with `--gpus all` (compose: a device reservation).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Extras: llm (language models), hf (Parquet and datasets folders as text corpora).
ARG EXTRAS=llm,hf

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GPUFLEX_HOME=/var/lib/gpuflex

RUN pip install --index-url "${TORCH_INDEX}" "${TORCH_SPEC}" \
    && echo "${TORCH_SPEC}" > /tmp/torch-constraint.txt
COPY . /src
# GPUFlex is installed from its own wheel, kept in /opt/gpuflex/dist: the portal's Join page finds
# it there (pip records where it came from) and offers it, so friends install this exact version.
RUN pip wheel --no-deps --wheel-dir /opt/gpuflex/dist /src \
    && pip install -c /tmp/torch-constraint.txt "$(ls /opt/gpuflex/dist/gpuflex-*.whl)[${EXTRAS}]" \
    && install -m 0755 /src/docker/node.sh /usr/local/bin/gpuflex-node \
    && rm -rf /src /tmp/torch-constraint.txt \
    && useradd --system --create-home --home-dir /var/lib/gpuflex --shell /usr/sbin/nologin gpuflex \
    && install -d -o gpuflex -g gpuflex /run/gpuflex-seed \
    && gpuflex --version

USER gpuflex
WORKDIR /var/lib/gpuflex
VOLUME ["/var/lib/gpuflex"]
# 4001: the mesh (libp2p over TCP); 8470: the portal. Publish them on loopback unless others
# should reach them: `-p 127.0.0.1:8470:8470`.
EXPOSE 4001 8470
ENTRYPOINT ["gpuflex"]
CMD ["node", "start", "--listen", "/ip4/0.0.0.0/tcp/4001"]
