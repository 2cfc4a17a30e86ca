//! Reading `status --json` / `GET /cluster/status`: typed accessors and a comparable `View`, so tests
//! can say "every node agrees" with one `==` and print a readable diff when they do not.

use std::collections::BTreeMap;

use serde_json::Value;

/// One member row as the tests compare it (lease_remaining_ms, routes and connections move all the
/// time, so they are left out of agreement checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub cluster_addr: String,
    pub role: String,
    pub state: String,
}

/// What every node must agree on once the cluster has settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub cluster_id: String,
    pub leader: Option<u64>,
    pub ring_version: u64,
    /// sorted
    pub ring_live: Vec<String>,
    /// by name
    pub members: BTreeMap<String, Member>,
}

impl View {
    pub fn from_json(v: &Value) -> Option<View> {
        let leader = match &v["leader"] {
            Value::Null => None,
            l => Some(l["id"].as_u64()?),
        };
        let mut ring_live: Vec<String> =
            v["ring"]["live"].as_array()?.iter().filter_map(|s| s.as_str().map(str::to_string)).collect();
        ring_live.sort();
        let mut members = BTreeMap::new();
        for m in v["members"].as_array()? {
            let member = Member {
                id: m["id"].as_u64()?,
                name: m["name"].as_str()?.to_string(),
                cluster_addr: m["cluster_addr"].as_str().unwrap_or_default().to_string(),
                role: m["role"].as_str()?.to_string(),
                state: m["state"].as_str()?.to_string(),
            };
            members.insert(member.name.clone(), member);
        }
        Some(View {
            cluster_id: v["cluster_id"].as_str().unwrap_or_default().to_string(),
            leader,
            ring_version: v["ring"]["version"].as_u64()?,
            ring_live,
            members,
        })
    }

    pub fn voters(&self) -> usize {
        self.members.values().filter(|m| m.role == "voter").count()
    }

    pub fn learners(&self) -> usize {
        self.members.values().filter(|m| m.role == "learner").count()
    }

    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.get(name)
    }

    pub fn member_by_id(&self, id: u64) -> Option<&Member> {
        self.members.values().find(|m| m.id == id)
    }

    pub fn all_live(&self) -> bool {
        self.members.values().all(|m| m.state == "live")
    }

    pub fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.members.values().map(|m| m.id).collect();
        ids.sort();
        ids
    }
}

pub fn node_id(status: &Value) -> Option<u64> {
    status["node"]["id"].as_u64()
}

pub fn term(status: &Value) -> Option<u64> {
    status["term"].as_u64()
}

pub fn commit_index(status: &Value) -> Option<u64> {
    status["commit_index"].as_u64()
}

pub fn applied_index(status: &Value) -> Option<u64> {
    status["applied_index"].as_u64()
}

pub fn leader_name(status: &Value) -> Option<String> {
    status["leader"]["name"].as_str().map(str::to_string)
}
