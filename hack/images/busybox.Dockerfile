# A minimal base with a shell: Debian's static busybox and its applets (sh, date, stat, ...),
# for images whose probes run a shell where nothing can be pulled. hack/images.sh builds it
# from a context holding the host's /bin/busybox (Debian's busybox-static).
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
# Some programs look the user up; 65532 is the non-root user every image here runs as.
RUN echo 'root:x:0:0:root:/root:/bin/sh' > /etc/passwd && \
    echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh' >> /etc/passwd && \
    echo 'root:x:0:' > /etc/group && echo 'nonroot:x:65532:' >> /etc/group && \
    mkdir -p /tmp /home/nonroot && chmod 1777 /tmp && chown 65532:65532 /home/nonroot
