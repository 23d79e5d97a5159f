//! What serde cannot check: references between keys, ranges, uniqueness,
//! and whether a spec can be switched at all. Every error names its key.

use super::*;

impl Config {
    /// The embedded default: a POS service and a UnionPay service in front of
    /// three channel nodes on 127.0.0.1 (what the demo runs).
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Self::from_toml(DEFAULT_TOML)
    }

    /// Loads a TOML file, applies environment overrides, and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let source = config::File::from(path).format(config::FileFormat::Toml);
        Self::build(source, std::env::vars())
    }

    /// Parses TOML text (e.g. the embedded demo config), with environment
    /// overrides, and validates.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Self::from_toml_with_env(text, std::env::vars())
    }

    /// [`Config::from_toml`] with the environment given (for tests).
    pub fn from_toml_with_env(
        text: &str,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::build(config::File::from_str(text, config::FileFormat::Toml), vars)
    }

    fn build<S>(
        source: S,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError>
    where
        S: config::Source + Send + Sync + 'static,
    {
        let file = config::Config::builder().add_source(source).build()?;
        let tree: serde_json::Value = file.clone().try_deserialize()?;
        let overrides = env_overrides(&tree, vars)?;
        let mut merged = config::Config::builder().add_source(file);
        for o in &overrides {
            merged = merged
                .set_override(o.key.as_str(), o.value.as_str())
                .map_err(|e| {
                    blame(
                        &overrides,
                        o.key.clone(),
                        Box::new(Reason::Parse(e.to_string())),
                    )
                })?;
        }
        let merged = merged.build()?;
        // serde_path_to_error names the key of every type error: durations,
        // addresses, CIDRs, codes, enums and unknown keys alike.
        let cfg: Config = serde_path_to_error::deserialize(merged).map_err(|e| {
            let key = e.path().to_string();
            blame(&overrides, key, Box::new(Reason::Parse(reason(e.inner()))))
        })?;
        cfg.validate().map_err(|e| match e {
            ConfigError::Invalid { key, reason } => blame(&overrides, key, reason),
            other => other,
        })?;
        Ok(cfg)
    }

    /// The configuration as the switch runs it: every default filled in,
    /// including those resolved later (`correlation.key` from the spec,
    /// `max_in_links` from `links`), for `isoswitch check` to print.
    pub fn effective(&self) -> Config {
        let mut cfg = self.clone();
        for svc in &mut cfg.services {
            if svc.correlation.key.is_empty()
                && let Ok(spec) = svc.load_spec()
            {
                svc.correlation.key = default_key(&spec);
            }
            if let FrontConfig::Simplex(f) = &mut svc.front {
                f.max_in_links = Some(f.max_in_links());
            }
        }
        cfg
    }

    /// Checks what serde cannot: references between keys, ranges, uniqueness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.services.is_empty() {
            return Err(invalid("service", "no service is configured"));
        }
        if let Some(admin) = &self.admin {
            admin.validate()?;
        }
        self.journal.validate()?;
        if self
            .store
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
        {
            self.journal.validate_remote()?;
        }
        let mut names = std::collections::HashSet::new();
        for (i, svc) in self.services.iter().enumerate() {
            let key = format!("service[{i}]");
            if !names.insert(svc.name.as_str()) {
                return Err(invalid(
                    format!("{key}.name"),
                    Reason::DuplicateService(svc.name.clone()),
                ));
            }
            svc.validate(&key)?;
        }
        tls::validate(self).map_err(|e| invalid(e.key(), e))?;
        Ok(())
    }
}

/// Why the switch cannot carry `spec` on a service, if it cannot: its declines,
/// reversals and approval checks write and read F39 as a 2-character
/// response code (ISO 8583:1987). A dialect with a 3-digit action code
/// (ISO 8583:1993, `iso93binary`) is for `decode`, captures and replay
/// only, until response codes of other widths are supported.
pub fn unswitchable(spec: &Spec) -> Option<Reason> {
    match spec.field(39) {
        Some(f) if f.is_fixed() && f.length == 2 => None,
        Some(f) => Some(Reason::F39NotTwo {
            spec: spec.name().to_string(),
            fixed: f.is_fixed(),
            length: f.length,
        }),
        None => Some(Reason::NoF39(spec.name().to_string())),
    }
}

impl ServiceConfig {
    /// Resolves the service's spec (built-in name or file path).
    pub fn load_spec(&self) -> Result<Spec, ConfigError> {
        Spec::resolve(&self.spec).map_err(|e| invalid("spec", e))
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !name::is_safe_name(self.name.as_bytes(), name::NAME_MAX) {
            return Err(invalid(
                format!("{key}.name"),
                Reason::BadName(self.name.clone()),
            ));
        }
        let spec = Spec::resolve(&self.spec).map_err(|e| invalid(format!("{key}.spec"), e))?;
        if let Some(why) = unswitchable(&spec) {
            return Err(invalid(format!("{key}.spec"), why));
        }
        self.back.validate(&format!("{key}.back"))?;
        if let Some(c) = &self.capture {
            c.validate(&format!("{key}.capture"))?;
        }
        for (j, part) in self.correlation.key.iter().enumerate() {
            if let KeyPart::Field(id) = part
                && spec.field(*id).is_none()
            {
                return Err(invalid(
                    format!("{key}.correlation.key[{j}]"),
                    Reason::SpecLacksField {
                        spec: self.spec.clone(),
                        id: *id,
                    },
                ));
            }
            if *part == KeyPart::Tpdu && !spec.envelope().tpdu {
                return Err(invalid(
                    format!("{key}.correlation.key[{j}]"),
                    Reason::SpecLacksTpdu(self.spec.clone()),
                ));
            }
        }
        self.timeouts.validate(&format!("{key}.timeouts"))?;
        let node_ids: Vec<&str> = self.back.nodes.iter().map(|n| n.id.as_str()).collect();
        self.integrity
            .validate(&format!("{key}.integrity"), &node_ids)?;
        if let Some(codes) = &self.integrity.approval_codes {
            // Compared as the F39 text of this spec: each must be a value of
            // its F39 (a letter is not, in a BCD one).
            spec.field_codes(39, codes).map_err(|e| {
                invalid(
                    format!("{key}.integrity.approval_codes"),
                    Reason::NotF39Values {
                        spec: self.spec.clone(),
                        source: e,
                    },
                )
            })?;
        }
        self.advices_can_be_stored(key)?;
        for (j, text) in self.accept_mti.iter().enumerate() {
            if crate::route::MtiPattern::parse(text).is_none() {
                return Err(invalid(
                    format!("{key}.accept_mti[{j}]"),
                    Reason::NotAnMtiPattern(text.clone()),
                ));
            }
        }
        if self.correlation.max_in_flight == 0 {
            return Err(invalid(
                format!("{key}.correlation.max_in_flight"),
                "must be > 0 (0 declines every request)",
            ));
        }
        if let Some(stamp) = &self.f37_stamp {
            stamp
                .validate(&self.back.node_ids()?)
                .map_err(|e| invalid(format!("{key}.f37_stamp"), e))?;
        }
        self.validate_front(key, &spec)
    }

    /// `advices = "store-and-forward"` needs a front the switch can
    /// acknowledge an advice on once it is stored: a `listen` front
    /// multiplexing its node connections. On a peer's links the
    /// acknowledgement would have to go out on an out link, and OneConnect
    /// carries no store; the sender would repeat forever, each repeat stored
    /// again. Refused rather than silently broken.
    fn advices_can_be_stored(&self, key: &str) -> Result<(), ConfigError> {
        if self.integrity.advices != crate::config::Advices::StoreAndForward {
            return Ok(());
        }
        let why = match &self.front {
            FrontConfig::Listen(l) if l.mode == ListenMode::Multiplex => return Ok(()),
            FrontConfig::Listen(_) => "a `oneconnect` front does not store advices",
            FrontConfig::Simplex(_) | FrontConfig::Connect(_) => {
                "the switch cannot acknowledge a peer's advice on its links; the peer's advices go to the nodes (`forward`)"
            }
        };
        Err(invalid(
            format!("{key}.integrity.advices"),
            Reason::CannotStoreAdvices(why),
        ))
    }

    fn validate_front(&self, key: &str, spec: &Spec) -> Result<(), ConfigError> {
        match &self.front {
            FrontConfig::Listen(l) => l.validate(&format!("{key}.front")),
            FrontConfig::Simplex(_) | FrontConfig::Connect(_) => {
                if self.f37_stamp.is_none() {
                    return Err(invalid(
                        format!("{key}.f37_stamp"),
                        "this front routes responses by the F37 node stamp: set { offset, width }",
                    ));
                }
                if spec.field(37).is_none() {
                    return Err(invalid(
                        format!("{key}.spec"),
                        "this front needs F37 in the spec",
                    ));
                }
                let front_key = format!("{key}.front");
                if let FrontConfig::Simplex(f) = &self.front {
                    f.validate(&front_key)?;
                }
                self.front
                    .link_set()
                    .map_or(Ok(()), |set| set.validate(&front_key))
            }
        }
    }
}

impl LinkSet {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(1..=64).contains(&self.links) {
            return Err(invalid(format!("{key}.links"), "must be within 1..=64"));
        }
        for (k, v) in [
            ("keepalive_idle", self.keepalive_idle),
            ("partial_frame_timeout", self.partial_frame_timeout),
            ("reconnect_min", self.reconnect_min),
            ("sign_on_retry", self.sign_on_retry),
        ] {
            if v.is_zero() {
                return Err(invalid(format!("{key}.{k}"), "must be > 0"));
            }
        }
        if self.reconnect_max < self.reconnect_min {
            return Err(invalid(
                format!("{key}.reconnect_max"),
                "must be >= reconnect_min",
            ));
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        Ok(())
    }
}

impl SimplexFront {
    pub fn max_in_links(&self) -> usize {
        self.max_in_links.unwrap_or(self.links)
    }

    /// What only a simplex front has; the link set is checked by [`LinkSet`].
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_in_links() == 0 {
            return Err(invalid(format!("{key}.max_in_links"), "must be > 0"));
        }
        if self.in_link_silence.is_zero() {
            return Err(invalid(format!("{key}.in_link_silence"), "must be > 0"));
        }
        for (k, id) in [("member_id", &self.member_id), ("peer_id", &self.peer_id)] {
            if id.is_empty() || id.len() > 11 || !id.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(format!("{key}.{k}"), "1 to 11 digits"));
            }
        }
        Ok(())
    }
}

impl ListenFront {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(invalid(format!("{key}.max_connections"), "must be > 0"));
        }
        if self.max_per_source == 0 {
            return Err(invalid(format!("{key}.max_per_source"), "must be > 0"));
        }
        for (k, v) in [
            (
                "max_in_flight_per_connection",
                self.max_in_flight_per_connection,
            ),
            ("max_in_flight_per_source", self.max_in_flight_per_source),
        ] {
            if v == 0 {
                return Err(invalid(
                    format!("{key}.{k}"),
                    "must be > 0: 0 would decline every request",
                ));
            }
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        if self.partial_frame_timeout.is_zero() {
            return Err(invalid(
                format!("{key}.partial_frame_timeout"),
                "must be > 0",
            ));
        }
        Ok(())
    }
}

impl BackConfig {
    /// The node IDs, parsed; an invalid one is named by its index.
    pub fn node_ids(&self) -> Result<Vec<NodeId>, ConfigError> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                n.id.parse::<NodeId>()
                    .map_err(|e| invalid(format!("back.node[{i}].id"), e))
            })
            .collect()
    }

    /// Where a node added at runtime may be: `allowed_networks`, or, when
    /// that is empty, each configured node's own address as a /32 (/128).
    pub fn allowed_networks(&self) -> Vec<IpNet> {
        if !self.allowed_networks.is_empty() {
            return self.allowed_networks.clone();
        }
        self.nodes
            .iter()
            .map(|n| IpNet::from(n.address.ip()))
            .collect()
    }

    /// Whether a node at `addr` may be added at runtime.
    pub fn allows(&self, addr: std::net::SocketAddr) -> bool {
        self.allowed_networks()
            .iter()
            .any(|net| net.contains(&addr.ip()))
    }

    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(invalid(
                format!("{key}.node"),
                "a back needs at least one node",
            ));
        }
        if !(1..=64).contains(&self.connections_per_node) {
            return Err(invalid(
                format!("{key}.connections_per_node"),
                "must be within 1..=64",
            ));
        }
        if self.write_queue == 0 {
            return Err(invalid(format!("{key}.write_queue"), "must be > 0"));
        }
        if self.partial_frame_timeout.is_zero() {
            return Err(invalid(
                format!("{key}.partial_frame_timeout"),
                "must be > 0",
            ));
        }
        if self.reconnect_min.is_zero() || self.reconnect_max < self.reconnect_min {
            return Err(invalid(
                format!("{key}.reconnect_max"),
                "need 0 < reconnect_min <= reconnect_max",
            ));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let nkey = format!("{key}.node[{i}]");
            if !name::is_safe_name(node.id.as_bytes(), NODE_ID_MAX) {
                return Err(invalid(
                    format!("{nkey}.id"),
                    Reason::BadNodeId(node.id.clone()),
                ));
            }
            if !ids.insert(node.id.as_str()) {
                return Err(invalid(
                    format!("{nkey}.id"),
                    Reason::DuplicateNode(node.id.clone()),
                ));
            }
            if node.weight == 0 {
                return Err(invalid(
                    format!("{nkey}.weight"),
                    "must be > 0 (use admin = \"disabled\")",
                ));
            }
            if !self.allowed_networks.is_empty() && !self.allows(node.address) {
                return Err(invalid(
                    format!("{nkey}.address"),
                    Reason::OutsideNetworks {
                        address: node.address,
                        back: key.to_string(),
                    },
                ));
            }
        }
        let ids = self.node_ids()?;
        RuleSet::compile(&self.rules, &ids).map_err(|e| invalid(format!("{key}.rule"), e))?;
        self.health
            .state
            .validate()
            .map_err(|e| invalid(format!("{key}.health"), e))?;
        if self.health.timeout.is_zero() || self.health.interval.is_zero() {
            return Err(invalid(
                format!("{key}.health"),
                "interval and timeout must be > 0",
            ));
        }
        Ok(())
    }
}
