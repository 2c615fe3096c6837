# meshfeed's container image: the image launch/k8s/*.yaml run (meshfeed:latest). Build it
# from the repository root with
#
#   docker build -t meshfeed:latest .
#   podman build -t meshfeed:latest .        (podman and buildah read the same file)
#
# optionally with --build-arg MESHFEED_GIT_REV=$(git rev-parse --short HEAD), which
# `meshfeed --version` reports.
#
# Two stages. `build` is the README's own install: launch/setup.sh installs the system
# packages (OpenMPI, HDF5, UCX, libclang, ...) and `cargo build --release` builds the
# command line, on the official Rust image of Debian 12. `runtime` is Debian 12 slim with
# only the shared libraries the binary loads (OpenMPI, UCX, HDF5, fontconfig/FreeType for
# the benchmark's plots), mpirun and an SSH server for the MPIJob's workers, the stripped
# binary on PATH and the Kubernetes scripts at the path the manifests run; it runs as an
# unprivileged numeric user, so `runAsNonRoot: true` can be verified by the kubelet. The
# one image serves every manifest of launch/k8s/: the Indexed Job and the JobSet run its
# ENTRYPOINT, the MPIJob's launcher runs mpirun and its workers run sshd as that user.
#
# tests/emulation/image.rs checks this file against the code without a container engine:
# the build steps against launch/quickstart.sh and launch/setup.sh, the runtime packages
# against `ldd` of the binary, the build context (.dockerignore) against what cargo needs,
# the paths against the manifests, and it runs this image's ENTRYPOINT from a copy of the
# runtime stage's files. Keep to the instructions it understands (it says which).

# The toolchain: the one this repository is built and tested with here, and at least the
# newest rust-version of the locked dependencies (tests/emulation/image.rs checks that).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# setup.sh alone first, so that the system packages stay cached while the sources change.
COPY launch/setup.sh launch/setup.sh
RUN bash launch/setup.sh
COPY . .
# Read by build.rs for `meshfeed --version`; when empty (the build context holds no .git),
# the version says it was not built from a git checkout.
ARG MESHFEED_GIT_REV=
RUN cargo build --release --locked
# Debug info out (the release profile's line tables are most of the file); the symbols
# stay, for backtraces.
RUN strip --strip-debug target/release/meshfeed

FROM debian:bookworm-slim AS runtime
LABEL org.opencontainers.image.title="meshfeed" \
      org.opencontainers.image.description="Exact global shuffle data loader for distributed training, over MPI or UCX" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
# Runtime libraries only (no -dev packages): the packages that own the libraries `ldd`
# reports for the binary, with their dependencies, plus openmpi-bin for mpirun (the MPI
# transport; it brings openssh-client for multi-node runs), openssh-server for the MPIJob's
# workers (launch/k8s/mpijob-sshd.conf; the user's shell is /bin/sh, as sshd runs the
# launcher's commands through it). Versions are those of Debian 12,
# the release the builder links against; not pinned further, so that security updates
# apply on rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libfontconfig1 \
        libfreetype6 \
        libhdf5-103-1 \
        libopenmpi3 \
        libucx0 \
        openmpi-bin \
        openssh-server \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 meshfeed \
    && useradd --uid 10001 --gid meshfeed --no-log-init --create-home \
        --home-dir /home/meshfeed --shell /bin/sh meshfeed
COPY --from=build /src/target/release/meshfeed /usr/local/bin/meshfeed
# launch/k8s/ whole: the manifests run its scripts (entrypoint.sh; the MPIJob's
# mpijob-launcher.sh, and mpijob-worker.sh with mpijob-sshd.conf) from here.
COPY launch/k8s/ /opt/meshfeed/launch/k8s/
# The MPIJob launcher's ssh client: port 2222, the job's host keys not checked.
COPY launch/k8s/mpijob-ssh.conf /etc/ssh/ssh_config.d/meshfeed.conf
# The manifests' workingDir.
WORKDIR /opt/meshfeed
USER 10001:10001
# Checks the rank variables (RANK or JOB_COMPLETION_INDEX, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT, MESHFEED_JOB_TOKEN), then execs `meshfeed <args>`: the container's
# arguments are meshfeed's, e.g. `run --transport ucx --data /data --batch-size 1024`.
# For mpirun (the MPI transport) and sshd the MPIJob overrides the entrypoint.
ENTRYPOINT ["/opt/meshfeed/launch/k8s/entrypoint.sh"]
