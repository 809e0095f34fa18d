"""PyTorch Geometric: node features in Tessera, the graph in memory.

``FeatureStore(client, bucket, prefix)`` is a ``torch_geometric.data.FeatureStore`` whose
tensors are ``.npy`` objects: attribute ``attr_name`` of node type ``group_name`` is the object
``{prefix}{group_name}/{attr_name}.npy`` (``_`` stands for the group of a homogeneous graph).
PyG's loaders fetch a mini-batch's features with one ``multi_get_tensor`` call; here that is
one ``Client.gather_many``: every node of the cluster gets one request per round for every
attribute's rows, straight into the output tensors, checksummed and rebuilt from parity where a
node is down.

    store = tessera.pyg.FeatureStore(client, "graphs", "products/")
    store.put_tensor(features, group_name=None, attr_name="x", index=None)  # products/_/x.npy
    graph = torch_geometric.distributed.LocalGraphStore.from_data(edge_ids, edge_index, num_nodes)
    loader = NeighborLoader((store, graph), num_neighbors=[10, 5], batch_size=1024, ...)

Objects are replaced whole: ``put_tensor`` with an index other than ``None`` (a partial update)
is refused. The attribute list is read once (a listing) and kept up to date by this store's own
``put_tensor``/``remove_tensor``; call ``refresh()`` after other writers add tables. Rows read
are cached when the client's gather cache is on (``client.set_gather_cache``).
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    from torch_geometric.data import FeatureStore as _PygFeatureStore
    from torch_geometric.data import TensorAttr
except ImportError as e:  # pragma: no cover - exercised only without PyG
    raise ImportError("tessera.pyg needs torch and torch_geometric: pip install torch torch_geometric") from e

from .errors import GatherError, NotFound

#: The group name written for a homogeneous graph's attributes (PyG's ``None``).
DEFAULT_GROUP = "_"
_SUFFIX = ".npy"


def _name_part(value: Any, what: str) -> str:
    """A group or attribute name as one path component of a key."""
    if isinstance(value, tuple):
        raise ValueError(f"edge-type groups ({value!r}) are not stored here: PyG's loaders fetch node features")
    if not isinstance(value, str) or not value:
        raise ValueError(f"a {what} name must be a non-empty string, not {value!r}")
    if "/" in value or value.startswith(".") or value == DEFAULT_GROUP and what == "group":
        raise ValueError(f"{what} name {value!r} cannot be a key component (no '/', no leading '.', not '_')")
    return value


class FeatureStore(_PygFeatureStore):
    """A PyG ``FeatureStore`` over ``.npy`` objects under ``bucket/prefix`` (see the module)."""

    def __init__(self, client: Any, bucket: str, prefix: str = ""):
        super().__init__()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.__dict__["_client"] = client
        self.__dict__["_bucket"] = bucket
        self.__dict__["_prefix"] = prefix
        self.__dict__["_attrs"] = None

    # Names -----------------------------------------------------------------------------------

    def key_of(self, attr: TensorAttr) -> str:
        """The object key of an attribute."""
        group = DEFAULT_GROUP if attr.group_name is None else _name_part(attr.group_name, "group")
        return f"{self._prefix}{group}/{_name_part(attr.attr_name, 'attribute')}{_SUFFIX}"

    def _attr_of(self, key: str) -> TensorAttr | None:
        rest = key[len(self._prefix):]
        group, sep, name = rest.partition("/")
        if not sep or "/" in name or not name.endswith(_SUFFIX) or len(name) == len(_SUFFIX):
            return None
        return TensorAttr(None if group == DEFAULT_GROUP else group, name[: -len(_SUFFIX)])

    def refresh(self) -> None:
        """Lists the attributes again (after another writer added or removed tables)."""
        attrs = []
        for entry in self._client.list(self._bucket, self._prefix):
            attr = self._attr_of(entry.key)
            if attr is not None:
                attrs.append(attr)
        self.__dict__["_attrs"] = attrs

    # PyG's FeatureStore ----------------------------------------------------------------------

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        whole = attr.index is None or (isinstance(attr.index, slice) and attr.index == slice(None))
        if not whole:
            raise ValueError(
                f"{self.key_of(attr)}: Tessera objects are written whole; put the full tensor (index=None)")
        self._client.put_tensor(self._bucket, self.key_of(attr), tensor)
        if self._attrs is not None:
            known = {(a.group_name, a.attr_name) for a in self._attrs}
            if (attr.group_name, attr.attr_name) not in known:
                self._attrs.append(TensorAttr(attr.group_name, attr.attr_name))
        return True

    def _get_tensor(self, attr: TensorAttr) -> Any:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list) -> list:
        """Every attribute's rows in one ``gather_many``: one request per node per round."""
        try:
            requests = []
            for attr in attrs:
                key = self.key_of(attr)
                index = attr.index
                if index is None or isinstance(index, (slice, int)):
                    # A slice, one row, or the whole tensor: those rows' indices.
                    everything = torch.arange(self._rows_of(key))
                    index = everything[index] if isinstance(index, slice) else (
                        everything if index is None else everything[torch.tensor([index])])
                requests.append((self._bucket, key, index))
            outs = self._client.gather_many(requests)
        except NotFound as e:
            raise KeyError(f"no tensor {e}") from None
        tensors = [torch.from_numpy(out) for out in outs]
        return [t[0] if isinstance(attr.index, int) else t for attr, t in zip(attrs, tensors)]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        key = self.key_of(attr)
        try:
            self._client.stat(self._bucket, key)
        except NotFound:
            return False
        self._client.delete(self._bucket, key)
        if self._attrs is not None:
            self.__dict__["_attrs"] = [a for a in self._attrs
                                       if (a.group_name, a.attr_name) != (attr.group_name, attr.attr_name)]
        return True

    def _get_tensor_size(self, attr: TensorAttr) -> tuple | None:
        key = self.key_of(attr)
        try:
            info = self._client.stat(self._bucket, key)
        except NotFound:
            return None
        table = self._client._table(self._bucket, key, info, None, None)
        return table.shape_of(table.rows)

    def get_all_tensor_attrs(self) -> list:
        if self._attrs is None:
            self.refresh()
        # PyG sets `index` on what it gets back: hand out copies.
        return [TensorAttr(a.group_name, a.attr_name) for a in self._attrs]

    def _rows_of(self, key: str) -> int:
        info = self._client.stat(self._bucket, key)
        return self._client._table(self._bucket, key, info, None, None).rows

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"tessera.pyg.FeatureStore(bucket={self._bucket!r}, prefix={self._prefix!r})"


__all__ = ["FeatureStore", "DEFAULT_GROUP", "GatherError"]
