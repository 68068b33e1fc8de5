"""The control plane's certificate authority: the CA itself (authority), who is calling
(authn), and the IstioCertificateService gRPC adapter (service)."""
